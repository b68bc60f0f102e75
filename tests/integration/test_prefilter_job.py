"""A one-off job through the lexical first pass, on a real worker: the bundle is built
from the chunks the pass embedded, and every chunk of its pages reaches the vector store
afterwards, for the index."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.integration.test_research_job import QUESTION, _assert_grounded
from tests.testweb import LoopbackWeb
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.models import Bundle


def test_a_prefiltered_job_answers_first_and_indexes_every_chunk_later(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    store = tmp_path / "q"
    env = clean_env(
        **test_web.env(), CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(store),
        WEBCTX_PREFILTER__WHEN="always", WEBCTX_PREFILTER__CHUNKS="6",
        WEBCTX_PREFILTER__PER_PAGE="0", WEBCTX_PREFILTER__NEIGHBOURS="0",
    )  # fmt: skip
    worker = start_worker(env)
    done = run_cli(env, "research", QUESTION, "--max-sources", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Bundle.model_validate_json(done.stdout)
    _assert_grounded(bundle, test_web)
    # The question and the 6 chunks BM25 chose, not the pages' every chunk.
    assert bundle.stats.chunks > 6 and bundle.stats.cache_hits + bundle.stats.embed_requests
    assert bundle.stats.tokens_embedded < 64 * 8
    pages = bundle.stats.fetched
    deadline = time.monotonic() + 60
    while worker.log.read_text().count("page indexed after its job") < pages:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, worker.log.read_text()[-3000:]  # type: ignore[attr-defined]
        time.sleep(0.2)
    worker.stop()  # type: ignore[attr-defined]
    reopened = EdgeVectorStore(store)
    try:
        assert reopened.count() == bundle.stats.chunks
    finally:
        reopened.close()
