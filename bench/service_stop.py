"""The local service stopped, or killed, while its downloads are in flight, side by side
for short and long pages: how long `webctx service stop` takes, how soon the downloads
start again once the waiting client has started the service again, when the job ends,
and how long the killed service's Valkey outlives it.

A waiting `webctx research --max-sources 3` on a loopback site whose every page
trickles in (40 pieces over `seconds`); the stop or the kill comes 2 s after all three
pages are being downloaded.

    python bench/service_stop.py [--short 8] [--long 80] [--write]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import write_section  # noqa: E402
from webctx.adapters.hash_embedder import HashEmbedder  # noqa: E402
from webctx.demo.web import load_corpus  # noqa: E402
from webctx.devweb.embeddings import make_embeddings_app  # noqa: E402
from webctx.devweb.searxng import SearchDoc, make_searxng_app  # noqa: E402
from webctx.devweb.server import LoopbackServer  # noqa: E402
from webctx.devweb.site import SitePage, make_site_app  # noqa: E402

QUESTION = "how do lithium-ion batteries degrade?"
SOURCES = 3
PIECES = 40
MODEL = "hash-embedding"


@dataclass
class Run:
    """One stop (or kill) mid-download and what followed."""

    how: str
    page_s: float
    stop_s: float | None  # the `webctx service stop` command's wall time
    again_s: float  # from the stop's (kill's) end to the pages asked for again
    done_s: float  # from the stop's (kill's) end to the job's end
    total_s: float  # from the job's submission to its end
    valkey_s: float | None  # how long the killed service's Valkey outlived it
    ok: bool


Web = tuple[list[LoopbackServer], dict[str, str], collections.Counter[str]]


def start_web(seconds: float) -> Web:
    """Site (pages trickling over `seconds`), search and embeddings; their env and hits."""
    import trafilatura

    corpus, hits = load_corpus(), collections.Counter[str]()
    pages = {p.path: SitePage(body=p.html, trickle_s=seconds / PIECES,
                              trickle_bytes=-(-len(p.html.encode()) // PIECES))
             for p in corpus}  # fmt: skip
    site = LoopbackServer(make_site_app(pages, hits=hits)).start()
    docs = [SearchDoc(site.url + p.path, p.title, trafilatura.extract(p.html) or "", p.published)
            for p in corpus]  # fmt: skip
    search = LoopbackServer(make_searxng_app(docs)).start()
    embed = HashEmbedder(model=MODEL).vectors
    embeddings = LoopbackServer(make_embeddings_app(embed, model=MODEL, rpm=None, tpm=None)).start()
    env = {"WEBCTX_SEARCH_PROVIDER": "searxng", "WEBCTX_SEARXNG_URL": search.url,
           "OPENAI_BASE_URL": embeddings.url + "/v1", "OPENAI_API_KEY": "bench",
           "WEBCTX_EMBEDDING_MODEL": MODEL, "WEBCTX_ALLOWED_NETWORKS": "127.0.0.1/32",
           "WEBCTX_FETCH__PER_HOST_DELAY_S": "0", "WEBCTX_FETCH__PER_HOST_CONCURRENCY": "8",
           "WEBCTX_FETCH__TOTAL_TIMEOUT_S": str(seconds + 60),
           "WEBCTX_FETCH__READ_TIMEOUT_S": "10"}  # fmt: skip
    return [site, search, embeddings], env, hits


def _pages(hits: collections.Counter[str]) -> dict[str, int]:
    return {path: n for path, n in hits.items() if path.endswith(".html")}


def _until(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)


def _valkey_pid(data: Path) -> int | None:
    try:
        return int((data / "valkey" / "valkey.pid").read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def one(how: str, seconds: float) -> Run:
    """A job, stopped (or killed) mid-download, resumed by its waiting client."""
    servers, web_env, hits = start_web(seconds)
    data = Path(tempfile.mkdtemp(prefix="webctx-bench-stop-"))
    ours = ("WEBCTX_", "CELERY_", "OPENAI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env.update(web_env, PYTHONPATH=str(ROOT), WEBCTX_DATA_DIR=str(data))
    cli = [sys.executable, "-m", "webctx.cli"]
    submitted = time.monotonic()
    job = subprocess.Popen(
        [*cli, "research", QUESTION, "--max-sources", str(SOURCES)], env=env, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        _until(lambda: len(_pages(hits)) >= SOURCES, 120)
        time.sleep(2.0)
        first, valkey = dict(_pages(hits)), _valkey_pid(data)
        started, stop_s, valkey_s = time.monotonic(), None, None
        if how == "stop":
            subprocess.run([*cli, "service", "stop"], env=env, cwd=ROOT, capture_output=True)
            stop_s = time.monotonic() - started
        else:
            os.kill(int((data / "service.lock").read_text()), signal.SIGKILL)
            if valkey is not None:
                _until(lambda: not _alive(valkey), 60)
                valkey_s = time.monotonic() - started
        ended = time.monotonic()
        _until(lambda: all(_pages(hits).get(p, 0) > n for p, n in first.items()), 600)
        again = time.monotonic() - ended
        out, _ = job.communicate(timeout=seconds * 3 + 300)
        done = time.monotonic()
        urls = [s["url"] for s in json.loads(out)["sources"]] if job.returncode == 0 else []
        ok = len(urls) == len(set(urls)) == SOURCES
    finally:
        job.kill()
        subprocess.run([*cli, "service", "stop"], env=env, cwd=ROOT, capture_output=True)
        for server in servers:
            server.stop()
    return Run(how, seconds, stop_s, again, done - ended, done - submitted, valkey_s, ok)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--short", type=float, default=8.0)
    parser.add_argument("--long", type=float, default=80.0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    runs = [one(how, s) for how, s in (("stop", args.short), ("stop", args.long),
                                        ("kill", args.short), ("kill", args.long))]  # fmt: skip
    rows = "".join(
        f"| {r.how} | {r.page_s:g} | {'-' if r.stop_s is None else f'{r.stop_s:.1f}'} | "
        f"{'-' if r.valkey_s is None else f'{r.valkey_s:.2f}'} | {r.again_s:.1f} | "
        f"{r.done_s:.1f} | {r.total_s:.1f} | {'yes' if r.ok else 'NO'} |\n"
        for r in runs
    )
    body = (
        f"A waiting `webctx research --max-sources {SOURCES}` (embedded default) on a loopback "
        f"site whose pages each trickle in over the given time ({PIECES} pieces); 2 s after "
        "all its pages started downloading, `webctx service stop` (its wall time, the "
        "command's own start included) or a SIGKILL of the service. The client starts the "
        "service again; seconds are counted from the stop's (the kill's) end.\n\n"
        "| how | page s | stop command s | Valkey outlived the killed service s | pages asked "
        "for again after s | job done after s | job from submission s | sources all there, "
        "once |\n|---|---|---|---|---|---|---|---|\n"
        f"{rows}\nLoad average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end "
        f"({os.cpu_count()} cores, shared).\n"
    )
    print(body)  # noqa: T201
    if args.write:
        write_section("service_stop", body)


if __name__ == "__main__":
    main()
