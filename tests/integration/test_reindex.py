"""Scheduled re-indexing end to end: two Celery beat processes, a real worker, a loopback
site whose pages change between runs (ETag / If-None-Match), an OpenAI-compatible
embeddings server counting what it embeds, the test Redis db, the embedded vector engine.

Checks: unchanged pages are answered 304 and never re-embedded; a changed page is swapped
while a concurrent searcher sees it whole (one version, never absent); pages gone (404) or
dropped from the sitemap leave the index; two beats do not double any run.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import REDIS_DB, ROOT, clean_env, redis_url, run_cli
from tests.testweb import MODEL
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.devweb.embeddings import make_embeddings_app
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.index.page_records import PageRecords
from webctx.index.sources import SourceRegistry

pytestmark = pytest.mark.slow
DB = REDIS_DB
TENANT = "local"
EVERY_S = 4
QUERY = "harbour topic1 section"


def article(topic: str, version: int) -> str:
    body = " ".join(
        f"<p>Shared harbour words. {topic} section {i}, revision {version}: this text "
        f"describes the {topic} in enough detail to be kept as main text.</p>"
        for i in range(5)
    )
    return f"<html><head><title>{topic}</title></head><body><article>{body}</article></body></html>"


class MutableSite:
    """Pages by path with ETags; 304 on a matching If-None-Match; counts 200s per path."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, str, int]] = {}  # path -> (body, type, version)
        self.ok: collections.Counter[str] = collections.Counter()
        self.not_modified: collections.Counter[str] = collections.Counter()

    def put(self, path: str, body: str, content_type: str = "text/html") -> None:
        version = self.pages.get(path, ("", "", 0))[2] + 1
        self.pages[path] = (body, content_type, version)

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            path = request.url.path
            if path not in self.pages:
                return Response(b"gone", 404, media_type="text/plain")
            body, content_type, version = self.pages[path]
            etag = f'"{version}"'
            if request.headers.get("if-none-match") == etag:
                self.not_modified[path] += 1
                return Response(b"", 304, headers={"ETag": etag})
            self.ok[path] += 1
            return Response(body.encode(), 200, headers={"ETag": etag,
                                                         "Content-Type": content_type})  # fmt: skip

        return Starlette(routes=[Route("/{path:path}", endpoint)])


def sitemap(base: str, paths: list[str]) -> str:
    urls = "".join(f"<url><loc>{base}{p}</loc></url>" for p in paths)
    return f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'


class Beat:
    def __init__(self, env: dict[str, str], tmp: Path, n: int) -> None:
        self.log = tmp / f"beat-{n}.log"
        self._fh = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "webctx.workers.app", "beat",
             "--loglevel", "INFO", "--schedule", str(tmp / f"beat-{n}.db")],  # fmt: skip
            env=env, cwd=ROOT, stdout=self._fh, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def ticks_sent(self) -> int:
        return self.log.read_text(errors="replace").count("webctx-index-tick")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._fh.close()


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url(DB), decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_beat_reindexes_only_changes_swaps_atomically_and_never_double_fires(
    r: redis.Redis, tmp_path: Path, start_worker: Any
) -> None:
    site = MutableSite()
    embedded_texts = collections.Counter[str]()
    hasher = HashEmbedder(model=MODEL)

    def embed(texts: list[str]) -> list[list[float]]:
        for text in texts:
            embedded_texts[text] += 1
        return hasher.vectors(texts)

    web = LoopbackServer(site.app()).start()
    emb = LoopbackServer(make_embeddings_app(embed, model=MODEL, rpm=None, tpm=None)).start()
    beats: list[Beat] = []
    try:
        paths = [f"/p{i}.html" for i in range(6)]
        for i, path in enumerate(paths):
            site.put(path, article(f"topic{i}", 1))
        site.put("/sitemap.xml", sitemap(web.url, paths), "application/xml")
        env = clean_env(
            CELERY_BROKER_URL=redis_url(DB),
            WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
            OPENAI_BASE_URL=emb.url + "/v1",
            OPENAI_API_KEY="test-key",
            WEBCTX_EMBEDDING_MODEL=MODEL,
            WEBCTX_ALLOWED_NETWORKS="127.0.0.1/32",
            WEBCTX_FETCH__PER_HOST_DELAY_S="0",
            WEBCTX_INDEX__TICK_S="1",
            WEBCTX_INDEX__GRACE_S="3",
            WEBCTX_INDEX__GONE_AFTER="1",
        )
        registry = SourceRegistry(r, min_every_s=1)  # runs seconds apart, not 5 minutes
        source = registry.add(TENANT, web.url + "/sitemap.xml", every_s=EVERY_S)
        start_worker(env, "-c", "4", "-Q", "reindex,rank")
        started = time.monotonic()
        beats = [Beat(env, tmp_path, n) for n in (1, 2)]

        def runs() -> int:
            found = registry.get(TENANT, source.source_id)
            return found.runs if found else 0

        wait_until(lambda: runs() >= 1, 90, "the first scheduled run")
        index = PageRecords(r)
        first = index.pages(TENANT)
        assert len(first) == 6
        after_first = embedded_texts.copy()
        assert after_first

        # Between runs: p1 changes, p4 goes 404, p5 leaves the sitemap. A run may be under
        # way as the site changes (it reads the old sitemap): the second run counted from
        # here is the first that surely started after the change.
        runs_before = runs()
        old_p1 = first[web.url + "/p1.html"].content_sha256
        site.put("/p1.html", article("topic1-rewritten", 2))
        del site.pages["/p4.html"]
        site.put("/sitemap.xml", sitemap(web.url, paths[:4] + ["/p4.html"]), "application/xml")

        # The worker holds the embedded engine: search through it, as the API does.
        client = Celery(broker=redis_url(DB), backend=redis_url(DB))
        problems: list[str] = []
        searches: list[int] = []
        seen: set[str] = set()
        stop = threading.Event()

        def searcher() -> None:
            while not stop.is_set():
                args = (TENANT, QUERY, 50, {})
                hits = client.send_task("webctx.index.search", args=args,
                                        queue="rank").get(timeout=30)  # fmt: skip
                p1 = {h["content_sha256"] for h in hits if h["url"].endswith("/p1.html")}
                seen.update(p1)
                searches.append(len(hits))
                if len(p1) != 1:
                    problems.append(f"p1 seen as {len(p1)} versions")

        thread = threading.Thread(target=searcher, daemon=True)
        thread.start()
        wait_until(lambda: runs() >= runs_before + 2, 60, "a run started after the change")
        time.sleep(1.0)
        stop.set()
        thread.join(timeout=40)
        assert not problems, problems[:5]
        assert len(searches) > 3  # the searcher ran across the swap

        now = index.pages(TENANT)
        assert set(now) == {web.url + f"/p{i}.html" for i in range(4)}
        assert now[web.url + "/p1.html"].content_sha256 != old_p1
        assert seen >= {now[web.url + "/p1.html"].content_sha256}
        report = registry.get(TENANT, source.source_id)
        assert report is not None
        # Unchanged pages: 304, never a second 200, never re-embedded.
        for path in ("/p0.html", "/p2.html", "/p3.html"):
            assert site.ok[path] == 1 and site.not_modified[path] >= 1
        assert site.ok["/p1.html"] == 2
        embedded_since = [t for t in embedded_texts - after_first if t != QUERY]
        assert embedded_since and all("topic1-rewritten" in t for t in embedded_since)

        # Two beats both ticked, yet every run had its own due time (no double firing).
        # Counted once the beats stopped and the runs they claimed finished: a run claimed
        # just now is still going (it was one of the flakes of a loaded machine).
        assert all(b.ticks_sent() > 0 for b in beats)
        for beat in beats:
            beat.stop()
        elapsed = time.monotonic() - started

        def claims() -> int:
            return len(r.keys("webctx:sources:claim:*"))

        # A claimed run that finds the previous one still holding the source's lock is
        # skipped (on a loaded machine a run outlasts EVERY_S): it is not a second firing,
        # and it never counts as a run. So: wait until no run holds the lock and the count
        # has stayed put, then every run had a claim of its own, and claims stayed within
        # one per due time.
        last = [-1, time.monotonic()]

        def settled() -> bool:
            if runs() != last[0] or r.keys("webctx:index:lock:*"):
                last[:] = [runs(), time.monotonic()]
                return False
            return time.monotonic() - last[1] > 3

        wait_until(settled, 60, "the claimed runs to finish")
        assert 2 <= runs() <= claims() <= elapsed / EVERY_S + 2
    finally:
        for beat in beats:
            beat.stop()
        web.stop()
        emb.stop()


def test_cli_adds_refreshes_searches_and_removes_sources(r: redis.Redis, tmp_path: Path) -> None:
    site = MutableSite()
    site.put("/walrus.html", article("walrus", 1))
    site.put("/otter.html", article("otter", 1))
    web = LoopbackServer(site.app()).start()
    docs = [SearchDoc(web.url + f"/{name}.html", name, f"{name} section harbour words")
            for name in ("walrus", "otter")]  # fmt: skip
    search = LoopbackServer(make_searxng_app(docs)).start()
    env = clean_env(
        WEBCTX_SEARCH_PROVIDER="searxng",
        WEBCTX_SEARXNG_URL=search.url,
        WEBCTX_REDIS_URL=redis_url(DB),
        WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
        WEBCTX_EMBEDDING_PROVIDER="hash",
        WEBCTX_ALLOWED_NETWORKS="127.0.0.1/32",
        WEBCTX_FETCH__PER_HOST_DELAY_S="0",
    )
    try:
        for path in ("/walrus.html", "/otter.html"):
            added = run_cli(env, "sources", "add", web.url + path, "--every", "1h")
            assert added.returncode == 0, added.stderr
        listed = json.loads(run_cli(env, "sources", "list", "--format", "json").stdout)
        assert {s["url"] for s in listed} == {web.url + "/walrus.html", web.url + "/otter.html"}
        refreshed = run_cli(env, "sources", "refresh", "--wait")
        assert refreshed.returncode == 0, refreshed.stderr
        reports = json.loads(refreshed.stdout)["sources"]
        assert sorted(rep["added"] for rep in reports.values()) == [1, 1]
        found = run_cli(env, "search", "walrus section", "--format", "json")
        assert found.returncode == 0, found.stderr
        hits = json.loads(found.stdout)
        assert hits[0]["url"] == web.url + "/walrus.html" and hits[0]["title"] == "walrus"
        # A research job takes both pages from the index: no download, and says so.
        downloads = sum(site.ok.values())
        job = run_cli(env, "research", "walrus section harbour", "--max-sources", "2")
        assert job.returncode == 0, job.stderr[-2000:]
        assert json.loads(job.stdout)["stats"]["index_reused"] == 2
        assert sum(site.ok.values()) == downloads
        removed = run_cli(env, "sources", "remove", web.url + "/walrus.html")
        assert removed.returncode == 0, removed.stderr
        after = json.loads(run_cli(env, "search", "walrus", "--format", "json").stdout)
        assert {h["url"] for h in after} == {web.url + "/otter.html"}
    finally:
        web.stop()
        search.stop()
