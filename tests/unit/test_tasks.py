"""The Celery tasks' own outcomes, run in-process on fakeredis with fakes of our Protocols."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from tests.factories import make_page
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.errors import ProviderError
from webctx.models import JobRequest, JobStatus, ScoredChunk
from webctx.settings import Settings
from webctx.workers import tasks
from webctx.workers.app import set_deps
from webctx.workers.deps import build_deps


class RefusingStore(MemoryVectorStore):
    """A vector store that stored the pages but refuses every search."""

    def search(
        self,
        vector: Sequence[float],
        *,
        limit: int,
        content_sha256s: Sequence[str],
        with_vectors: bool = True,
    ) -> list[ScoredChunk]:
        raise ProviderError("test-store", "refused")


def test_a_rank_that_fails_ends_the_job_failed_instead_of_leaving_it_to_the_watchdog(
    tmp_path: Path,
) -> None:
    settings = Settings(embedding_provider="hash", qdrant_path=tmp_path / "q")
    built = build_deps(settings, start=lambda stage, arguments: None)
    deps = dataclasses.replace(built, engine=dataclasses.replace(built.engine,
                                                                 _store=RefusingStore()))
    set_deps(deps)
    try:
        job_id = deps.jobs.create(JobRequest(question="how do batteries age?"))
        url_id = next(iter(deps.jobs.set_urls(job_id, ["https://example.org/a"])))
        deps.jobs.save_page(job_id, url_id, make_page())
        tasks.rank.run(job_id)
        assert deps.jobs.status(job_id) is JobStatus.FAILED
        assert "rank: test-store: refused" in (deps.jobs.progress(job_id).error or "")
    finally:
        set_deps(None)
