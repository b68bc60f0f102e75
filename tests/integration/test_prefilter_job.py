"""A one-off job through the lexical first pass, on a real worker: the bundle is built
from the chunks the pass embedded, and every chunk of its pages reaches the vector store
afterwards, for the index; its pages are embedded as they arrive, and rank embeds only
the rest."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.integration.test_research_job import QUESTION, _assert_grounded
from tests.testweb import LoopbackWeb, start_test_web
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.devweb.site import SitePage
from webctx.models import Bundle

GLACIER = "when did the Aletsch glacier retreat from the Rhone valley?"


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


def _glacier_page(n: int) -> str:
    paragraphs = "".join(
        f"<p>Ledger {n}.{i}: the Aletsch glacier retreat from the Rhone valley was measured "
        f"in survey {i}, when the ice front stood {100 + 7 * i + n} metres higher.</p>"
        for i in range(30)
    )
    return (
        f"<html><head><title>Aletsch ledger {n}</title></head><body><article><h1>Aletsch "
        f"glacier ledger {n}</h1>{paragraphs}</article></body></html>"
    )


@pytest.fixture
def glacier_web() -> Iterator[LoopbackWeb]:
    """Three glacier pages; the third answers only once the embeddings server has taken
    two requests (the question's and a fast page's, embedded ahead), or after 20 s: the
    order of arrival is the test's, not the machine's speed."""
    text = "Aletsch glacier retreat Rhone valley ledger survey ice front"

    def ready() -> bool:
        return web.embeddings_control.stats.accepted >= 2

    extra = {
        f"/glacier/{n}.html": (
            SitePage(body=_glacier_page(n), delay_s=20.0 if n == 2 else 0.0,
                     ready=ready if n == 2 else None),
            f"Aletsch glacier retreat ledger {n}", text,
        )
        for n in range(3)
    }  # fmt: skip
    web = start_test_web(extra=extra)
    yield web
    web.stop()


def test_a_prefiltered_jobs_pages_are_embedded_as_they_arrive_and_rank_embeds_the_rest(
    glacier_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    web_env = {
        **glacier_web.env(),
        "WEBCTX_FETCH__TOTAL_TIMEOUT_S": "30",
        "WEBCTX_FETCH__READ_TIMEOUT_S": "25",
        # The three pages share a host: unpaced, the fast two are in at once whichever
        # page is asked first.
        "WEBCTX_FETCH__PER_HOST_DELAY_S": "0",
    }  # the slow page must not time out
    env = clean_env(
        **web_env, CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
        WEBCTX_PREFILTER__WHEN="always",
    )  # fmt: skip
    start_worker(env)
    done = run_cli(env, "research", GLACIER, "--max-sources", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Bundle.model_validate_json(done.stdout)
    stats = bundle.stats
    assert stats.fetched == 3 and {s.url.rsplit("/", 1)[1] for s in bundle.sources} <= {
        "0.html",
        "1.html",
        "2.html",
    }
    # Every chunk is selected here (few pages); a fast page was embedded while the slow
    # one downloaded (the slow one waits for it), and rank embedded the slow page's chunks
    # (and what the other fast page stopped before, had the slow page come in first).
    assert stats.embedded_ahead > 0, stats
    assert 0 < stats.embedded_at_rank < stats.chunks, stats
    # (+1: the question, when rank came before its embed_question task had ended)
    assert stats.embedded_ahead + stats.embedded_at_rank - stats.chunks in (0, 1), stats
