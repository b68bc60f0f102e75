"""HTML extraction in child processes: on the machine's other cores, not in the worker's
interpreter.

In the local service every task of a job shares one interpreter. A page's extraction
(trafilatura, ~12 ms alone) took 40-200 ms in a 20-source job, because the pages that
arrived just before it held the interpreter with their embeds and stores; the slowest
page's extraction then stood between its download and its answer. A child process
extracts it at full speed on another core instead (docs/benchmarks.md, "latency").

Each child is a spawned interpreter that has imported the extraction and serves one
page at a time over a pipe. A page goes to an idle child, or, when none is idle (all
busy, or not started yet), is extracted in the calling thread as before. A child that
does not answer by the deadline is killed (a thread could not be) and replaced; one that
dies or fails hands the page back to the calling thread, which extracts it and reports
what the extraction raises, as before.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from webctx.errors import ExtractionError

logger = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0


@dataclass
class _Child:
    process: BaseProcess
    conn: Connection


class ExtractionChildren:
    """`count` child processes extracting HTML (`__call__`); thread-safe."""

    def __init__(self, count: int, *, target: str = "webctx.stages.fetch:_extract_html") -> None:
        self._count = count
        self._target = target
        self._idle: queue.SimpleQueue[_Child] = queue.SimpleQueue()
        self._context = multiprocessing.get_context("spawn")
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._children: list[_Child] = []

    def start(self) -> None:
        """Start the children in the background (each imports the extraction: ~0.5 s of
        CPU, in the child); pages are extracted in their own thread until one is ready."""
        for _ in range(self._count):
            threading.Thread(target=self._add, name="extract-child-start", daemon=True).start()

    def __call__(self, html: str, url: str, timeout_s: float) -> Any | None:
        """The extraction of `html` by an idle child, or None when none is idle or the
        child failed (the caller extracts in its own thread). ExtractionError when the
        child did not answer within `timeout_s` (it is killed and replaced)."""
        try:
            child = self._idle.get_nowait()
        except queue.Empty:
            return None
        try:
            child.conn.send((html, url))
            if not child.conn.poll(timeout_s):
                self._replace(child)
                raise ExtractionError(url, f"extraction took over {timeout_s}s")
            answer = child.conn.recv()
        except (EOFError, OSError):
            self._replace(child)
            return None
        self._idle.put(child)
        return answer[1] if answer[0] == "ok" else None

    def close(self) -> None:
        """Stop every child."""
        self._closed.set()
        with self._lock:
            children, self._children = self._children, []
        for child in children:
            _kill(child)

    def _add(self) -> None:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(theirs, self._target),
                                        name="webctx-extract", daemon=True)  # fmt: skip
        try:
            process.start()
        except OSError:
            logger.warning("extraction child not started", exc_info=True)
            return
        theirs.close()
        child = _Child(process, ours)
        with self._lock:
            self._children.append(child)
        if self._closed.is_set() or not ours.poll(START_TIMEOUT_S):
            _kill(child)
            return
        try:
            ours.recv()  # "ready": the extraction is imported
        except (EOFError, OSError):
            _kill(child)
            return
        self._idle.put(child)

    def _replace(self, child: _Child) -> None:
        _kill(child)
        with self._lock:
            if child in self._children:
                self._children.remove(child)
        if not self._closed.is_set():
            threading.Thread(target=self._add, name="extract-child-start", daemon=True).start()


def _kill(child: _Child) -> None:
    if child.process.is_alive():
        child.process.kill()
    child.process.join(5)
    child.conn.close()


def _serve(conn: Connection, target: str) -> None:
    """In the child: import the extraction, say so, then extract each page sent; exit as
    soon as the parent is gone, even mid-import (a killed service leaves no child)."""
    import importlib

    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    module, _, name = target.partition(":")
    extract = getattr(importlib.import_module(module), name)
    conn.send("ready")
    while True:
        try:
            html, url = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", extract(html, url)))
        except Exception as exc:  # noqa: BLE001 - the parent extracts it again and reports
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:300]))


def _exit_with_parent() -> None:
    """Wait for the parent's end (its sentinel becomes readable), then exit at once."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    multiprocessing.connection.wait([parent.sentinel])
    os._exit(0)
