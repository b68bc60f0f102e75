"""A first-pass job's pages embedded as they arrive: which chunks of a page, when it
stops, and that rank then embeds only what is missing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis

from tests.conftest import redis_url
from tests.factories import make_page
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.errors import ProviderUnavailable
from webctx.jobs import pages, steps
from webctx.jobs.embed_cache import RedisEmbeddingCache
from webctx.jobs.engine import Engine
from webctx.models import JobRequest, JobStatus
from webctx.protocols import Embeddings
from webctx.settings import ChunkSettings, EmbedSettings, PrefilterSettings, Settings
from webctx.stages.ahead import embed_ahead, likely_selected
from webctx.stages.chunk import chunk_page
from webctx.stages.prefilter import select_candidates
from webctx.workers.deps import Deps, build_deps

QUESTION = "when did the glacier retreat?"
_FILLER = "\n\n".join(f"The harbour record {i} notes ships and tides." for i in range(40))


def _text(fact: str) -> str:
    return f"{_FILLER}\n\n{fact}\n\nThe harbour closed for winter, the ledger says."


class CountingEmbedder(HashEmbedder):
    """The hash embedder, in process as the local model is, counting the texts it embeds."""

    in_process = True

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> Embeddings:
        self.texts += texts
        return super().embed(texts)


def _cache() -> RedisEmbeddingCache:
    client = redis.Redis.from_url(redis_url())
    return RedisEmbeddingCache(client)


def test_a_pages_likely_chunks_are_its_own_first_pass_with_the_job_limits_shared_out() -> None:
    page = make_page(text=_text("The glacier retreated in 1850, the record says."))
    chunks = chunk_page(page, max_tokens=16, overlap_tokens=0)
    prefilter = PrefilterSettings(chunks=12, per_page=1, neighbours=4)
    order = likely_selected(QUESTION, chunks, prefilter=prefilter, sources=4)
    # 12 / 4 = 3 best, the page's best 1 (among them), the neighbours of the best 1.
    alone = select_candidates(QUESTION, chunks, limit=3, per_page=1, neighbours=1)
    assert sorted(order) == alone.selected
    assert "1850" in chunks[order[0]].text  # most likely first
    scores = [alone.scores[i] for i in order]
    assert scores == sorted(scores, reverse=True)


def test_embed_ahead_fills_the_cache_and_stops_when_told(redis_client: object) -> None:
    page = make_page(text=_text("The glacier retreated in 1850, the record says."))
    embedder, cache = CountingEmbedder(), _cache()
    checks: list[int] = []

    def stop() -> bool:
        checks.append(1)
        return len(checks) > 1  # one batch, then every page is in

    prefilter = PrefilterSettings(chunks=40, per_page=8, neighbours=8)
    outcome = embed_ahead(QUESTION, page, embedder=embedder, cache=cache,
                          chunking=ChunkSettings(max_tokens=16), embedding=EmbedSettings(),
                          prefilter=prefilter, sources=1, stop=stop, batch=4)  # fmt: skip
    assert outcome.chunks == len(embedder.texts) == 4 and outcome.requests == 1
    assert any("1850" in t for t in embedder.texts)
    assert all(v is not None for v in cache.get_many(embedder.model, 256, embedder.texts))


Started = list[tuple[str, list[tuple[str | int, ...]]]]


def test_embed_ahead_sends_a_whole_page_at_once_without_a_batch(redis_client: object) -> None:
    # An API's time is the provider's round trip: one request per page, not one per 16.
    page = make_page(text=_text("The glacier retreated in 1850, the record says."))
    embedder = CountingEmbedder()
    prefilter = PrefilterSettings(chunks=40, per_page=8, neighbours=8)
    outcome = embed_ahead(QUESTION, page, embedder=embedder, cache=_cache(),
                          chunking=ChunkSettings(max_tokens=16), embedding=EmbedSettings(),
                          prefilter=prefilter, sources=1, stop=lambda: False,
                          batch=None)  # fmt: skip
    assert outcome.requests == 1 and outcome.chunks == len(embedder.texts) > 16


class RefusingEmbedder(CountingEmbedder):
    """Refuses every request, as a provider that is down does."""

    def embed(self, texts: Sequence[str]) -> Embeddings:
        self.texts += texts
        raise ProviderUnavailable(self.model, "down")


def test_embed_ahead_does_not_retry_a_refused_request(redis_client: object) -> None:
    # A retry's backoff would keep the page unsettled, and rank waiting for it.
    page = make_page(text=_text("The glacier retreated in 1850, the record says."))
    embedder = RefusingEmbedder()
    with pytest.raises(ProviderUnavailable):
        embed_ahead(QUESTION, page, embedder=embedder, cache=_cache(),
                    chunking=ChunkSettings(max_tokens=16), embedding=EmbedSettings(),
                    prefilter=PrefilterSettings(), sources=1, stop=lambda: False)  # fmt: skip
    assert len(embedder.texts) == 16  # one attempt at the first batch


def _engine(
    tmp_path: Path, embedder: CountingEmbedder, **prefilter: object
) -> tuple[Deps, Engine, Started]:
    """Broker mode, tasks recorded instead of sent; the counting embedder and a cache."""
    started: Started = []
    settings = Settings(embedding_provider="hash", qdrant_path=tmp_path / "q",
                        broker_url=redis_url(), redis_url=redis_url(),
                        prefilter=PrefilterSettings.model_validate(prefilter))  # fmt: skip
    deps = build_deps(settings, start=lambda stage, args: started.append((stage, list(args))))
    engine = dataclasses.replace(deps.engine, embedder=embedder, cache=_cache())
    return deps, engine, started


def test_a_first_pass_jobs_pages_are_embedded_before_rank_and_rank_embeds_the_rest(
    tmp_path: Path, redis_client: object
) -> None:
    embedder = CountingEmbedder()
    deps, engine, started = _engine(tmp_path, embedder, when="local", chunks=6, per_page=2,
                                    neighbours=0)  # fmt: skip
    try:
        job_id = deps.jobs.create(JobRequest(question=QUESTION))
        urls = ["https://example.org/a", "https://example.org/b"]
        a, b = deps.jobs.set_urls(job_id, urls)
        deps.jobs.save_page(job_id, a, make_page(url=urls[0], text=_text(
            "The glacier retreated in 1850, the record says.")))  # fmt: skip
        deps.jobs.save_page(job_id, b, make_page(url=urls[1], text=_text(
            "The glacier began to retreat in 1850 as summers warmed.")))  # fmt: skip
        pages.fetch_one(engine, job_id, a)  # b still downloading: a is embedded ahead
        assert started == [("embed", [(job_id, a)])]
        pages.embed_one(engine, job_id, a, retry=lambda exc: None)
        ahead = len(embedder.texts)
        assert ahead >= 2 and deps.jobs.counters(job_id)["embedded_ahead"] == ahead
        pages.fetch_one(engine, job_id, b)  # the last page: rank knows the selection now
        assert [stage for stage, _ in started] == ["embed", "rank"]
        steps.rank_job(engine, job_id, force=False, retry=lambda exc: None)
        assert deps.jobs.status(job_id) is JobStatus.SUCCEEDED
        bundle = deps.jobs.bundle(job_id)
        assert bundle is not None and "1850" in bundle.chunks[0].text
        stats = bundle.stats
        assert stats.embedded_ahead == ahead
        # The question and the 6 selected chunks, less those found in the cache.
        assert stats.embedded_at_rank == len(embedder.texts) - ahead < 1 + 6
        assert stats.cache_hits >= 1
    finally:
        deps.close()


def test_no_page_is_embedded_ahead_when_the_setting_is_off(
    tmp_path: Path, redis_client: object
) -> None:
    embedder = CountingEmbedder()
    deps, engine, started = _engine(tmp_path, embedder, when="local", ahead=False)
    try:
        job_id = deps.jobs.create(JobRequest(question=QUESTION))
        a, _ = deps.jobs.set_urls(job_id, ["https://example.org/a", "https://example.org/b"])
        deps.jobs.save_page(job_id, a, make_page(text=_text("The glacier retreated in 1850.")))
        pages.fetch_one(engine, job_id, a)
        assert started == [] and embedder.texts == []  # settled: rank embeds it all
    finally:
        deps.close()
