"""PDF text with PDFium (pypdfium2), in a child process the parser cannot escape.

PDFium is C++ reading hostile input: a decompression bomb, a page tree that loops, or a
bug can take all memory or spin for ever, and a thread cannot be stopped. So each PDF is
read in a child process with RLIMIT_AS (memory) and RLIMIT_CPU set before it sees a byte,
and a wall deadline after which the parent kills it. A child's death is a per-source
failure (`timeout`, `too_large`), never a stuck or killed worker.

Children come from multiprocessing's forkserver, started lazily once per process: forking
the worker itself is unsafe when it runs threads (Celery's threads pool, the fetch loop),
while the fork server is a fresh single-threaded process that has imported pypdfium2
already, so a child costs a fork instead of an interpreter start (docs/benchmarks.md).
A process that forks after it has read a PDF cannot use its parent's fork server
(multiprocessing's limit); webctx's workers build their reader in each pool child.
"""

from __future__ import annotations

import logging
import multiprocessing
import resource
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any

from webctx.errors import UnreadablePdf
from webctx.models import PdfText

logger = logging.getLogger(__name__)

_CONTEXT_LOCK = threading.Lock()
_context: ForkServerContext | SpawnContext | None = None
_UNIX_PATH_MAX = 107
_FORKSERVER_SOCKET_SUFFIX = len("/pymp-xxxxxxxx/listener-xxxxxxxx")
"""What multiprocessing adds to the temp dir for the fork server's socket."""
_OOM_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGTRAP, signal.SIGILL, signal.SIGBUS}


@dataclass(frozen=True)
class PdfLimits:
    """What one PDF may cost (FetchSettings.pdf_*)."""

    max_pages: int = 300
    cpu_s: float = 15.0
    memory_mb: int = 256
    timeout_s: float = 20.0


class SandboxedPdfReader:
    """A PdfReader that reads each PDF in a limited child process; thread-safe."""

    def __init__(self, limits: PdfLimits) -> None:
        self._limits = limits

    def read(self, body: bytes, *, url: str) -> PdfText:
        """Page texts and metadata of `body`; raises UnreadablePdf (reason: encrypted,
        malformed, too_many_pages, timeout, too_large)."""
        started = time.monotonic()
        answer = _run_child(body, self._limits)
        if logger.isEnabledFor(logging.DEBUG):
            ms = round((time.monotonic() - started) * 1000)
            logger.debug("pdf read", extra={"url": url, "ok": answer[0] == "ok", "ms": ms})
        if answer[0] == "ok":
            return PdfText.model_validate(answer[1])
        _, reason, message = answer
        raise UnreadablePdf(url, message, reason=reason)


def _forkserver() -> ForkServerContext | SpawnContext:
    """The forkserver context, its server preloading this module (hence pypdfium2); or,
    where the temp dir's path is too long for the fork server's unix socket (a long TMPDIR),
    spawn: a fresh interpreter per PDF, slower to start (it imports pypdfium2) but as safe."""
    global _context
    with _CONTEXT_LOCK:
        if _context is None and (
            len(tempfile.gettempdir()) + _FORKSERVER_SOCKET_SUFFIX > _UNIX_PATH_MAX
        ):
            tmpdir = tempfile.gettempdir()
            logger.warning("temp dir path too long for a fork server socket: PDFs are read "
                           "in spawned processes", extra={"tmpdir": tmpdir})  # fmt: skip
            _context = multiprocessing.get_context("spawn")
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            # "__main__" too: else every child imports the entry script again (spawn.prepare)
            context.set_forkserver_preload(["__main__", __name__, "pypdfium2"])
            _context = context
        return _context


def _run_child(body: bytes, limits: PdfLimits) -> tuple[Any, ...]:
    """("ok", PdfText fields) or ("error", reason, message), never an exception."""
    context = _forkserver()
    ours, theirs = context.Pipe()
    child = context.Process(target=_child_main, args=(theirs, limits), daemon=True,
                            name="webctx-pdf")  # fmt: skip
    child.start()
    theirs.close()
    deadline = time.monotonic() + limits.timeout_s
    # Sent from a thread: a child that stops reading must not hold us past the deadline.
    sender = threading.Thread(target=_send, args=(ours, body), daemon=True,
                              name="webctx-pdf-send")  # fmt: skip
    sender.start()
    try:
        try:
            if ours.poll(max(0.0, deadline - time.monotonic())):
                return tuple(ours.recv())
        except (EOFError, OSError):  # the child died: reap it, its exit code says why
            child.join(max(0.0, min(5.0, deadline - time.monotonic())))
        if child.is_alive():
            child.kill()
            child.join(5)
            return ("error", "timeout", f"not read within {limits.timeout_s}s")
        return _death(child.exitcode, limits)
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
        # The sender ends once the child is gone (EPIPE); only then may the pipe close, or
        # a write could land on a descriptor number the process has reused meanwhile.
        sender.join(5)
        ours.close()
        if child.exitcode is not None:
            child.close()


def _send(conn: Connection, body: bytes) -> None:
    try:
        conn.send_bytes(body)
    except OSError:  # the child is gone (or the parent closed the pipe): nothing to tell
        pass


def _death(exitcode: int | None, limits: PdfLimits) -> tuple[Any, ...]:
    """The failure of a child that died without answering."""
    if exitcode in (-signal.SIGXCPU, -signal.SIGKILL):
        return ("error", "timeout", f"over {limits.cpu_s} CPU seconds")
    if exitcode is not None and -exitcode in _OOM_SIGNALS:
        # PDFium aborts when an allocation fails, and RLIMIT_AS makes it fail.
        return ("error", "too_large", f"parser died (exit {exitcode}) under {limits.memory_mb} MiB")
    return ("error", "malformed", f"parser died (exit {exitcode})")


def _child_main(conn: Connection, limits: PdfLimits) -> None:
    """In the child: limit itself, read the body from `conn`, answer on `conn`."""
    cpu = max(1, int(limits.cpu_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        answer = _read_pdf(conn.recv_bytes(), limits.max_pages)
    except MemoryError:
        answer = ("error", "too_large", f"over {limits.memory_mb} MiB")
    except Exception as exc:  # noqa: BLE001 - anything else PDFium or Python raises
        answer = ("error", "malformed", f"{type(exc).__name__}: {exc}"[:300])
    conn.send(answer)
    conn.close()


def _read_pdf(body: bytes, max_pages: int) -> tuple[Any, ...]:
    import pypdfium2 as pdfium  # preloaded by the fork server
    import pypdfium2.raw as pdfium_c

    try:
        pdf = pdfium.PdfDocument(body)
    except pdfium.PdfiumError as exc:
        code = getattr(exc, "err_code", None)
        if code == pdfium_c.FPDF_ERR_PASSWORD:
            return ("error", "encrypted", "the PDF needs a password")
        if code == pdfium_c.FPDF_ERR_SECURITY:
            return ("error", "encrypted", "unsupported security handler")
        return ("error", "malformed", f"PDFium could not open it: {exc}"[:300])
    try:
        count = len(pdf)
        if count > max_pages:
            return ("error", "too_many_pages", f"{count} pages > {max_pages}")
        if count == 0:
            return ("error", "malformed", "no pages")
        meta = pdf.get_metadata_dict(skip_empty=True)
        return ("ok", {"pages": [_page_text(pdf, i) for i in range(count)],
                       "title": meta.get("Title"), "author": meta.get("Author"),
                       "created": meta.get("CreationDate") or meta.get("ModDate")})  # fmt: skip
    finally:
        pdf.close()


def _page_text(pdf: Any, index: int) -> str:
    page = pdf[index]
    try:
        textpage = page.get_textpage()
        try:
            return str(textpage.get_text_range())
        finally:
            textpage.close()
    finally:
        page.close()
