"""A research job's store task on the embedded engine: the page's points are searchable at
once, but the page is marked stored (later jobs skip it) only once a flush made them
durable. A worker killed before that flush leaves the page unmarked, and the next store
of it writes it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import redis_url
from tests.factories import make_page
from webctx.jobs import group_flush
from webctx.models import JobRequest
from webctx.settings import Settings
from webctx.stages.chunk import chunk_page
from webctx.workers import tasks
from webctx.workers.app import set_deps
from webctx.workers.deps import Deps, build_deps

TEXT = "\n\n".join(f"Harbour record {i}: ships, tides and the glacier." for i in range(40))
ROOT = Path(__file__).resolve().parents[2]


def _deps(qdrant: Path, url: str) -> Deps:
    settings = Settings(embedding_provider="hash", qdrant_path=qdrant, broker_url=url,
                        redis_url=url)  # fmt: skip

    def start(stage: str, arguments: Sequence[tuple[str | int, ...]]) -> None:
        """Tasks are run by hand here, not sent."""

    deps = build_deps(settings, start=start)
    set_deps(deps)
    return deps


def _embed_and_store(deps: Deps) -> tuple[str, str, int]:
    """A job with one page, its embed and store tasks run; (job, url id, chunks)."""
    job_id = deps.jobs.create(JobRequest(question="when did the glacier retreat?"))
    url_id = next(iter(deps.jobs.set_urls(job_id, ["https://example.org/a"])))
    page = make_page(text=TEXT)
    deps.jobs.save_page(job_id, url_id, page)
    tasks.embed.run(job_id, url_id)
    tasks.store.run(job_id, url_id)
    return job_id, url_id, len(chunk_page(page, max_tokens=64, overlap_tokens=0))


def test_a_stored_page_is_searchable_at_once_and_marked_only_after_the_flush(
    tmp_path: Path, redis_client: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_flush, "QUIET_S", 60.0)  # no flush of its own in this test
    deps = _deps(tmp_path / "q", redis_url())
    try:
        _, _, chunks = _embed_and_store(deps)
        sha = make_page(text=TEXT).content_sha256
        assert deps.engine.store.count() == chunks  # rank can search them now
        assert deps.engine.stored.chunks(sha) is None  # but not durable: not marked
        assert deps.engine.staging.get(sha) is not None
        deps.engine.flush_writes()
        assert deps.engine.stored.chunks(sha) == chunks
        assert deps.engine.staging.get(sha) is None
    finally:
        set_deps(None)
        deps.close()


CHILD = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from webctx.jobs import group_flush
group_flush.QUIET_S = group_flush.MAX_DELAY_S = 600.0
from tests.unit.test_store_durability import _deps, _embed_and_store
deps = _deps(Path({qdrant!r}), {url!r})
_embed_and_store(deps)
print("stored", flush=True)
time.sleep(600)
"""


def test_a_worker_killed_before_the_flush_leaves_the_page_to_be_stored_again(
    tmp_path: Path, redis_client: object
) -> None:
    qdrant, url = tmp_path / "q", redis_url()
    code = CHILD.format(root=str(ROOT), qdrant=str(qdrant), url=url)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "stored"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    deps = _deps(qdrant, url)
    try:
        sha = make_page(text=TEXT).content_sha256
        assert deps.engine.stored.chunks(sha) is None  # never claimed stored
        _, _, chunks = _embed_and_store(deps)  # a later job: the page is written again
        deps.engine.flush_writes()
        assert deps.engine.stored.chunks(sha) == chunks
        assert deps.engine.store.count() == chunks
    finally:
        set_deps(None)
        deps.close()
