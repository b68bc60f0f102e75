"""Which jobs take the lexical first pass, and the tasks such a job starts: rank straight
after the fetches, then one index task for the job's pages, taken in turn."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import redis_url
from tests.factories import make_page
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.jobs import pages
from webctx.jobs.steps import prefiltered
from webctx.models import JobRequest, JobStatus
from webctx.settings import PrefilterSettings, Settings
from webctx.stages.chunk import chunk_page
from webctx.workers import tasks
from webctx.workers.app import set_deps
from webctx.workers.deps import Deps, build_deps

_TEXT = "\n\n".join(f"The harbour record {i} notes ships and tides." for i in range(60)) + (
    "\n\nThe glacier retreated in 1850, the record says."
)


class InProcessEmbedder(HashEmbedder):
    """An embedder that says it runs in this process, as the local model does."""

    in_process = True


Started = list[tuple[str, list[tuple[str | int, ...]]]]


def _deps(tmp_path: Path, started: Started, **prefilter: object) -> Deps:
    """Broker mode, tasks recorded instead of sent."""
    settings = Settings(embedding_provider="hash", qdrant_path=tmp_path / "q",
                        broker_url=redis_url(), redis_url=redis_url(),
                        prefilter=PrefilterSettings.model_validate(prefilter))  # fmt: skip

    def start(stage: str, arguments: Sequence[tuple[str | int, ...]]) -> None:
        started.append((stage, list(arguments)))

    deps = build_deps(settings, start=start)
    set_deps(deps)
    return deps


@pytest.mark.parametrize(
    ("when", "in_process", "batch", "expected"),
    [
        ("local", True, None, True),
        ("local", False, None, False),  # an API: every chunk as its page arrives
        ("always", False, None, True),
        ("never", True, None, False),
        ("always", True, "b1", False),  # a batch item's pages are for the index
    ],
)
def test_which_jobs_take_the_first_pass(
    tmp_path: Path,
    redis_client: object,
    when: str,
    in_process: bool,
    batch: str | None,
    expected: bool,
) -> None:
    deps = _deps(tmp_path, [], when=when)
    embedder = InProcessEmbedder() if in_process else HashEmbedder()
    engine = dataclasses.replace(deps.engine, embedder=embedder)
    try:
        job_id = deps.jobs.create(JobRequest(question="when?"), batch=batch)
        assert prefiltered(engine, job_id) is expected
    finally:
        set_deps(None)


def test_a_first_pass_job_ranks_after_its_fetches_then_indexes_each_page(
    tmp_path: Path, redis_client: object
) -> None:
    started: Started = []
    deps = _deps(tmp_path, started, when="always", chunks=4, per_page=0, neighbours=0)
    try:
        job_id = deps.jobs.create(JobRequest(question="when did the glacier retreat?"))
        url_id = next(iter(deps.jobs.set_urls(job_id, ["https://example.org/a"])))
        page = make_page(text=_TEXT)
        deps.jobs.save_page(job_id, url_id, page)
        tasks.fetch.run(job_id, url_id)  # the page is there: on to what follows a fetch
        assert [stage for stage, _ in started] == ["rank"]  # no embed or store task
        tasks.rank.run(job_id)
        assert deps.jobs.status(job_id) is JobStatus.SUCCEEDED
        bundle = deps.jobs.bundle(job_id)
        assert bundle is not None and "1850" in bundle.chunks[0].text
        assert deps.engine.store.count() == 0  # answered from the first pass alone
        assert started[-1] == ("index_later", [(job_id,)])
        tasks.index_later.run(job_id)
        chunks = len(chunk_page(page, max_tokens=64, overlap_tokens=0))
        assert bundle.stats.chunks == chunks > 4
        assert deps.engine.store.count() == chunks
        assert deps.engine.stored.chunks(page.content_sha256) == chunks
    finally:
        set_deps(None)
        deps.close()


def test_the_embedded_default_indexes_the_pages_after_the_answer_too(tmp_path: Path) -> None:
    # Its jobs run in the local service, which outlives the command that asked.
    started: Started = []
    settings = Settings(embedding_provider="hash", qdrant_path=tmp_path / "q",
                        prefilter=PrefilterSettings(when="always"))  # fmt: skip
    deps = build_deps(settings, start=lambda stage, args: started.append((stage, list(args))))
    set_deps(deps)
    try:
        job_id = deps.jobs.create(JobRequest(question="when did the glacier retreat?"))
        url_id = next(iter(deps.jobs.set_urls(job_id, ["https://example.org/a"])))
        deps.jobs.save_page(job_id, url_id, make_page(text=_TEXT))
        tasks.rank.run(job_id)
        assert deps.jobs.status(job_id) is JobStatus.SUCCEEDED
        assert started[-1] == ("index_later", [(job_id,)])
    finally:
        set_deps(None)
        deps.close()


def test_deferred_indexing_stops_between_pages_when_told_and_a_later_run_does_the_rest(
    tmp_path: Path, redis_client: object
) -> None:
    deps = _deps(tmp_path, [], when="always", chunks=4, per_page=0, neighbours=0)
    try:
        job_id = deps.jobs.create(JobRequest(question="when did the glacier retreat?"))
        urls = [f"https://example.org/{n}" for n in range(3)]
        url_ids = list(deps.jobs.set_urls(job_id, urls))
        for url_id, url in zip(url_ids, urls, strict=True):
            deps.jobs.save_page(job_id, url_id, make_page(url=url, text=_TEXT + url))
        asked: list[int] = []

        def pause() -> bool:  # the first page may go; then interactive work arrives
            asked.append(len(asked))
            return len(asked) == 1

        engine = deps.engine
        assert not pages.index_later(engine, job_id, retry=_no_retry, pause=pause)
        assert len(asked) == 2  # asked before each page it would index
        def indexed() -> int:
            shas = [make_page(url=url, text=_TEXT + url).content_sha256 for url in urls]
            return sum(engine.stored.chunks(sha) is not None for sha in shas)

        assert indexed() == 1
        assert pages.index_later(engine, job_id, retry=_no_retry, pause=lambda: True)
        assert indexed() == 3
    finally:
        set_deps(None)
        deps.close()


def _no_retry(exc: Exception) -> None:
    raise exc


class SlowLocalEmbedder(InProcessEmbedder):
    """An in-process model that says it embeds `chunks_per_s` chunks a second."""

    def __init__(self, chunks_per_s: float) -> None:
        super().__init__()
        self.chunks_per_s = chunks_per_s


@pytest.mark.parametrize("chunks_per_s", [2.0, 1000.0])
def test_rank_embeds_what_the_local_model_s_speed_affords(
    tmp_path: Path, redis_client: object, chunks_per_s: float
) -> None:
    deps = _deps(tmp_path, [], when="local", embed_budget_s=1.0, min_chunks=2)
    engine = dataclasses.replace(deps.engine, embedder=SlowLocalEmbedder(chunks_per_s))
    set_deps(dataclasses.replace(deps, engine=engine))
    try:
        job_id = deps.jobs.create(JobRequest(question="when did the glacier retreat?"))
        url_id = next(iter(deps.jobs.set_urls(job_id, ["https://example.org/a"])))
        page = make_page(text=_TEXT)
        deps.jobs.save_page(job_id, url_id, page)
        tasks.rank.run(job_id)
        bundle = deps.jobs.bundle(job_id)
        assert bundle is not None and "1850" in bundle.chunks[0].text
        chunks = len(chunk_page(page, max_tokens=64, overlap_tokens=0))
        assert bundle.stats.chunks == chunks > 2
        # 2 chunks a second for 1 s: 2 chunks (and the question); fast: the whole pass
        expected = 2 if chunks_per_s < 10 else chunks
        assert bundle.stats.embedded_at_rank == expected + 1
    finally:
        set_deps(None)
        deps.close()
