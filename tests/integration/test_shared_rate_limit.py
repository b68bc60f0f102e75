"""Several worker processes share one embeddings key through the Redis limiter.

One loopback OpenAI-compatible server with a low limit and a 1 s window; real OS
processes (multiprocessing, spawn) each embed their own texts through the real openai
client. The server's own sliding window is the judge: it answers 429 to anything over."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.conftest import redis_url
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.devweb.embeddings import EmbeddingsControl, embeddings_control, make_embeddings_app
from webctx.devweb.server import LoopbackServer

# The server's 1 s window judges the limiter: these run alone (make test), not beside other tests.
pytestmark = pytest.mark.serial

MODEL = "text-embedding-3-small"
HASH = HashEmbedder(dimensions=32)
WORDS = "celery redis broker worker queue token limit window retry embed vector chunk".split()


def _texts(worker: int, n: int, words: int) -> list[str]:
    return [
        f"w{worker} t{i} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))
        for i in range(n)
    ]


def run_worker(
    url: str,
    base_url: str,
    worker: int,
    n: int,
    words: int,
    limits: dict[str, Any],
    out: Any,
    go: Any,
) -> None:
    """One worker process: embed its texts through the shared limiter; report the outcome."""
    from webctx.adapters.openai_embedder import OpenAIEmbedder
    from webctx.net.ratelimit import RedisRateLimiter, limiter_namespace
    from webctx.stages.embed import embed_with_cache

    client = redis.Redis.from_url(url)
    limiter = RedisRateLimiter(client, limiter_namespace(base_url, MODEL, "sk-test"), **limits)
    embedder = OpenAIEmbedder(base_url=base_url, api_key="sk-test", model=MODEL)
    go.wait(timeout=30)  # start together, as a busy worker pool would
    try:
        got = embed_with_cache(
            _texts(worker, n, words),
            embedder,
            cache=None,
            limiter=limiter,
            max_inputs=20,
            max_tokens_per_request=5000,
            max_input_tokens=500,
            max_attempts=8,
        )
        out.put(
            {
                "worker": worker,
                "vectors": len(got.vectors),
                "retries": got.retries,
                "tokens": got.tokens,
                "requests": got.requests,
            }
        )
    except Exception as exc:  # reported to the test, which fails on it
        out.put({"worker": worker, "error": repr(exc)})


@pytest.fixture
def flushed() -> Iterator[None]:
    client = redis.Redis.from_url(redis_url())
    client.flushdb()
    yield
    client.flushdb()
    client.close()


def _serve(**kwargs: Any) -> tuple[LoopbackServer, EmbeddingsControl, list[float]]:
    accepted: list[float] = []

    def embed(texts: list[str]) -> list[list[float]]:
        accepted.append(time.time())
        return HASH.vectors(texts)

    app = make_embeddings_app(embed, model=MODEL, window_s=1.0, **kwargs)
    return LoopbackServer(app), embeddings_control(app), accepted


def _run(
    base_url: str, workers: int, n: int, words: int, limits: dict[str, Any]
) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Barrier(workers)
    procs = [
        ctx.Process(target=run_worker, args=(redis_url(), base_url, w, n, words, limits, out, go))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    assert not [r for r in results if "error" in r], results
    return results


def test_workers_together_stay_under_the_limit_and_use_it(flushed: None) -> None:
    tpm, rpm = 20_000, 30
    server, control, accepted = _serve(rpm=rpm, tpm=tpm, latency_s=0.02)
    with server:
        results = _run(f"{server.url}/v1", 4, 400, 40, {"rpm": rpm, "tpm": tpm, "window_s": 1.0})
    total = sum(r["tokens"] for r in results)
    assert control.stats.rejected_429 == 0
    assert control.stats.tokens == total and sum(r["vectors"] for r in results) == 1600
    assert total > 3 * tpm  # several windows' worth
    # A sliding window admits a full window's worth at once, then one per window: at the
    # limit, the first and last admissions are (windows needed - 1) windows apart.
    requests = sum(r["requests"] for r in results)
    ideal = max(-(-total // tpm), -(-requests // rpm)) - 1
    span = max(accepted) - min(accepted)
    # Loose on purpose: a starved CPU (shared CI box) delays the processes, not the limiter.
    assert span < ideal * 1.3 + 0.5, (span, ideal)


def test_a_429_pauses_every_worker_and_no_job_fails(flushed: None) -> None:
    server, control, accepted = _serve(rpm=None, tpm=None, latency_s=0.01)
    limits = {"rpm": 100, "window_s": 1.0}  # ~100 requests/s shared: a steady stream
    injected_at: list[float] = []

    def inject() -> None:
        while len(accepted) < 40:
            time.sleep(0.002)
        control.fail_next(1, status=429, retry_after=1.0)
        while control.stats.injected == 0:
            time.sleep(0.001)
        injected_at.append(time.time())

    with server:
        threading.Thread(target=inject, daemon=True).start()
        results = _run(f"{server.url}/v1", 3, 400, 6, limits)
    assert injected_at, "the 429 was never served"
    t = injected_at[0]
    during = [a for a in accepted if t + 0.1 < a < t + 0.95]
    assert during == [], f"{len(during)} requests admitted while the key was paused"
    assert [a for a in accepted if a > t + 1.0], "nothing ran after the pause"
    assert sum(r["retries"] for r in results) == 1
    assert all(r["vectors"] == 400 for r in results)
