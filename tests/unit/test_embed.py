"""Embed stage and OpenAIEmbedder: the real openai client against a loopback embeddings API."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from webctx.adapters.hash_embedder import HashEmbedder
from webctx.adapters.openai_embedder import OpenAIEmbedder
from webctx.devweb.embeddings import EmbeddingsControl, embeddings_control, make_embeddings_app
from webctx.devweb.server import LoopbackServer
from webctx.errors import ProviderError, ProviderUnavailable, RateLimited
from webctx.net.ratelimit import parse_duration, retry_after_s
from webctx.protocols import Embedder
from webctx.stages.embed import (
    Batch,
    EmbedOutcome,
    backoff_delay,
    embed_texts,
    parallel_requests,
    plan_batches,
)
from webctx.tokens import count_tokens, truncate_to_tokens

MODEL = "text-embedding-3-small"
HASH = HashEmbedder(dimensions=256)
TEXTS = [f"chunk {i}: celery retries tasks on redis with backoff" for i in range(10)]
KEY = "sk-test-key"

Serve = Callable[..., tuple[OpenAIEmbedder, EmbeddingsControl]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a loopback embeddings API with the given limits; yield an embedder bound to it."""
    servers: list[LoopbackServer] = []

    def start(
        *, dimensions: int | None = None, key: str | None = KEY, **app_kwargs: object
    ) -> tuple[OpenAIEmbedder, EmbeddingsControl]:
        kwargs: dict[str, object] = {"rpm": None, "tpm": None, "api_key": KEY, **app_kwargs}
        app = make_embeddings_app(HASH.vectors, model=MODEL, **kwargs)  # type: ignore[arg-type]
        server = LoopbackServer(app).start()
        servers.append(server)
        embedder = OpenAIEmbedder(
            base_url=f"{server.url}/v1",
            api_key=key,
            model=MODEL,
            dimensions=dimensions,
            timeout_s=5,
        )
        return embedder, embeddings_control(app)

    yield start
    for server in servers:
        server.stop()


def run(embedder: Embedder, texts: list[str], **overrides: object) -> EmbedOutcome:
    options: dict[str, object] = {
        "max_inputs": 4,
        "max_tokens_per_request": 10_000,
        "max_input_tokens": 1000,
        "max_attempts": 6,
        "sleep": time.sleep,
        **overrides,
    }
    return embed_texts(texts, embedder, **options)  # type: ignore[arg-type]


def test_vectors_match_hash_embedder_through_base64(serve: Serve) -> None:
    embedder, _ = serve()
    vectors = embedder.embed(TEXTS[:3]).vectors  # the client asks for base64, decodes float32
    np.testing.assert_allclose(vectors, HASH.vectors(TEXTS[:3]), atol=1e-6)
    assert embedder.embed([]).vectors == []


def test_the_api_key_is_sent_as_a_bearer_token(serve: Serve) -> None:
    embedder, _ = serve()
    assert len(embedder.embed(["x"]).vectors) == 1
    wrong, _ = serve(key="sk-wrong")
    with pytest.raises(ProviderError, match="401"):
        wrong.embed(["x"])


def _answering(body: object) -> tuple[LoopbackServer, OpenAIEmbedder]:
    """A server whose /v1/embeddings always returns `body` (status 200)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def reply(_: object) -> JSONResponse:
        return JSONResponse(body)

    app = Starlette(routes=[Route("/v1/embeddings", reply, methods=["POST"])])
    server = LoopbackServer(app).start()
    return server, OpenAIEmbedder(base_url=f"{server.url}/v1", api_key=KEY, model=MODEL)


def test_a_server_that_ignores_base64_and_sends_floats_is_understood() -> None:
    rows = [{"object": "embedding", "index": 1, "embedding": [0.5, 1]},
            {"object": "embedding", "index": 0, "embedding": [0.25, -2.0]}]  # fmt: skip
    server, embedder = _answering({"object": "list", "data": rows})
    try:
        assert embedder.embed(["a", "b"]).vectors == [[0.25, -2.0], [0.5, 1.0]]
    finally:
        server.stop()


@pytest.mark.parametrize(
    "body",
    [
        {"object": "list"},  # no data
        {"data": [{"index": 0, "embedding": [0.1]}]},  # one vector for two inputs
        {"data": [{"index": 0, "embedding": [0.1]}, {"index": 0, "embedding": [0.2]}]},
        {"data": [{"index": 0, "embedding": "not base64!"}, {"index": 1, "embedding": [1]}]},
        {"data": [{"index": 0, "embedding": "AAA="}, {"index": 1, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": ["a"]}, {"index": 1, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]},
        ["not", "an", "object"],
    ],
)
def test_a_malformed_answer_is_a_provider_error(body: object) -> None:
    server, embedder = _answering(body)
    try:
        with pytest.raises(ProviderError, match="invalid response"):
            embedder.embed(["a", "b"])
    finally:
        server.stop()


def test_texts_packed_into_minimum_requests(serve: Serve) -> None:
    embedder, control = serve()
    outcome = run(embedder, TEXTS, max_inputs=4)
    assert outcome.requests == control.stats.requests == 3  # ceil(10 / 4)
    assert outcome.tokens == control.stats.tokens == sum(count_tokens(t) for t in TEXTS)
    np.testing.assert_allclose(outcome.vectors, HASH.vectors(TEXTS), atol=1e-6)


def test_a_calls_requests_are_in_flight_together_up_to_parallel(serve: Serve) -> None:
    embedder, control = serve(latency_s=0.2)
    outcome = run(embedder, TEXTS, max_inputs=4, parallel=4)  # 3 requests
    assert control.in_flight.most == 3 and outcome.requests == 3
    np.testing.assert_allclose(outcome.vectors, HASH.vectors(TEXTS), atol=1e-6)
    embedder, control = serve(latency_s=0.05)
    run(embedder, TEXTS, max_inputs=2, parallel=2)  # 5 requests, 2 at a time
    assert control.in_flight.most == 2 and control.stats.accepted == 5


def test_requests_go_one_at_a_time_when_parallel_is_one(serve: Serve) -> None:
    embedder, control = serve(latency_s=0.05)
    run(embedder, TEXTS, max_inputs=4)
    assert control.in_flight.most == 1 and control.stats.accepted == 3


def test_a_failed_request_among_parallel_ones_raises_after_the_others_end(serve: Serve) -> None:
    embedder, control = serve(latency_s=0.1)
    control.fail_next(1, status=500)
    with pytest.raises(ProviderUnavailable):
        run(embedder, TEXTS, max_inputs=4, parallel=3, max_attempts=1)
    assert control.stats.requests == 3 and control.stats.accepted == 2
    assert control.in_flight.now == 0  # nothing left running behind the error


def test_an_in_process_embedder_gets_one_request_at_a_time() -> None:
    class InProcess(HashEmbedder):
        in_process = True

    assert parallel_requests(InProcess(dimensions=8), 4) == 1
    assert parallel_requests(HASH, 4) == 4


def test_plan_batches_beats_input_order_when_tokens_bind() -> None:
    # In order, [6] [5, 5] [4] is three requests; [6, 4] [5, 5] is two.
    batches = plan_batches([6, 5, 5, 4], max_inputs=10, max_tokens_per_request=10)
    assert sorted(b.indices for b in batches) == [(0, 3), (1, 2)]
    assert plan_batches([1] * 9, max_inputs=4, max_tokens_per_request=100) == [
        Batch((0, 1, 2, 3), 4),
        Batch((4, 5, 6, 7), 4),
        Batch((8,), 1),
    ]


def test_rate_limit_storm_is_retried_until_it_succeeds(serve: Serve) -> None:
    embedder, control = serve(rpm=2, window_s=0.4)
    started = time.monotonic()
    outcome = run(embedder, TEXTS, max_inputs=2)  # 5 requests through a 2-per-0.4 s window
    assert control.stats.rejected_429 > 0
    assert outcome.requests == control.stats.accepted == 5
    assert outcome.retries == control.stats.rejected_429
    assert time.monotonic() - started >= 0.8  # three windows: the limiter really held us back
    np.testing.assert_allclose(outcome.vectors, HASH.vectors(TEXTS), atol=1e-6)


def test_injected_429_retry_after_is_honoured(serve: Serve) -> None:
    embedder, control = serve()
    control.fail_next(3, status=429, retry_after=0.05)
    slept: list[float] = []
    outcome = run(embedder, TEXTS[:2], sleep=slept.append)
    assert outcome.retries == 3 and control.stats.rejected_429 == 0
    assert all(0.05 <= s < 0.2 for s in slept)  # retry-after-ms 50, plus jitter


def test_server_errors_are_retried(serve: Serve) -> None:
    embedder, control = serve()
    control.fail_next(2, status=500)
    slept: list[float] = []
    outcome = run(embedder, TEXTS[:2], sleep=slept.append, base_delay_s=0.1)
    assert outcome.retries == 2 and control.stats.requests == 3
    assert 0.05 <= slept[0] <= 0.1 and 0.1 <= slept[1] <= 0.2  # exponential, jittered


def test_retries_of_a_failing_provider_wait_no_longer_than_its_breakers_verdict() -> None:
    verdict = ProviderUnavailable("openai: HTTP 500", kind="status", verdict_in_s=0.7)
    delays = [backoff_delay(n, verdict, base_delay_s=0.5, max_delay_s=20.0) for n in range(1, 7)]
    assert all(d <= 0.7 for d in delays) and delays[0] >= 0.25
    plain = [backoff_delay(n, ProviderUnavailable("x"), base_delay_s=0.5, max_delay_s=20.0)
             for n in range(1, 7)]  # fmt: skip
    assert plain[-1] >= 8.0  # without a verdict: the exponential backoff


def test_retries_exhausted_reraise(serve: Serve) -> None:
    embedder, control = serve()
    control.fail_next(3, status=500)
    with pytest.raises(ProviderUnavailable):
        run(embedder, TEXTS[:2], sleep=lambda _: None, max_attempts=3)
    assert control.stats.requests == 3


def test_long_retry_after_is_raised_not_slept(serve: Serve) -> None:
    embedder, control = serve()
    control.fail_next(1, status=429, retry_after=30)
    with pytest.raises(RateLimited) as info:
        run(embedder, TEXTS[:2], sleep=lambda _: pytest.fail("slept"), max_delay_s=5)
    assert info.value.retry_after == 30  # for the task's countdown
    assert control.stats.requests == 1


def test_bad_request_is_provider_error_not_retried(serve: Serve) -> None:
    embedder, control = serve(max_input_tokens=50)  # the server is stricter than we think
    with pytest.raises(ProviderError, match="maximum context length"):
        run(embedder, [" ".join(["word"] * 200)], max_input_tokens=1000)
    assert control.stats.requests == control.stats.rejected_400 == 1


def test_long_text_truncated_not_refused(serve: Serve) -> None:
    embedder, control = serve(max_input_tokens=100)
    long_text = " ".join(f"word{i}" for i in range(400))
    outcome = run(embedder, [long_text, "short"], max_input_tokens=100)
    assert outcome.truncated == 1 and control.stats.rejected_400 == 0
    expected = HASH.vectors([truncate_to_tokens(long_text, 100), "short"])
    np.testing.assert_allclose(outcome.vectors, expected, atol=1e-6)


def test_dimensions_truncate_and_renormalise(serve: Serve) -> None:
    embedder, _ = serve(dimensions=64)
    (vector,) = embedder.embed(["celery retries tasks on redis"]).vectors
    full = np.asarray(HASH.embed_one("celery retries tasks on redis"))[:64]
    assert len(vector) == 64
    np.testing.assert_allclose(vector, full / np.linalg.norm(full), atol=1e-6)


def test_dimensions_above_native_is_provider_error(serve: Serve) -> None:
    embedder, _ = serve(dimensions=1024)
    with pytest.raises(ProviderError, match="dimensions"):
        embedder.embed(["x"])


def test_each_answer_comes_with_its_own_rate_limit_headers(serve: Serve) -> None:
    embedder, _ = serve(rpm=100, tpm=10_000)
    first, second = embedder.embed(["hello world"]), embedder.embed(["hello world"])
    assert first.rate_limits["x-ratelimit-remaining-requests"] == "99"
    assert first.rate_limits["x-ratelimit-remaining-tokens"] == str(10_000 - 2)
    assert second.rate_limits["x-ratelimit-remaining-requests"] == "98"


def test_a_429_carries_its_rate_limit_headers(serve: Serve) -> None:
    embedder, control = serve(rpm=100, tpm=10_000)
    control.fail_next(1, status=429, retry_after=2.0)
    with pytest.raises(RateLimited) as refused:
        embedder.embed(["x"])
    assert refused.value.retry_after == pytest.approx(2.0)
    assert "x-ratelimit-limit-requests" in refused.value.rate_limits


def test_wrong_model_is_provider_error(serve: Serve) -> None:
    embedder, _ = serve()
    embedder.model = "no-such-model"
    with pytest.raises(ProviderError, match="404"):
        embedder.embed(["x"])


def test_unreachable_server_is_provider_unavailable() -> None:
    with LoopbackServer(make_embeddings_app(HASH.vectors, model=MODEL, rpm=None, tpm=None)) as srv:
        url = srv.url
    embedder = OpenAIEmbedder(base_url=f"{url}/v1", api_key=KEY, model=MODEL, timeout_s=2)
    with pytest.raises(ProviderUnavailable):
        embedder.embed(["x"])


def test_before_request_runs_before_every_attempt(serve: Serve) -> None:
    embedder, control = serve()
    control.fail_next(1, status=500)
    seen: list[Batch] = []
    run(embedder, TEXTS[:6], sleep=lambda _: None, before_request=seen.append)
    assert [len(b.indices) for b in seen] == [4, 4, 2]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "250", "retry-after": "1"}, 0.25),
        ({"retry-after": "3"}, 3.0),
        ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"}, 360.0),
        (
            {
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "17ms",
                "x-ratelimit-remaining-tokens": "5",
                "x-ratelimit-reset-tokens": "1s",
            },
            0.017,
        ),
        ({}, None),
    ],
)
def test_retry_after_from_openai_headers(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(headers) == pytest.approx(expected)


def test_parse_duration() -> None:
    assert parse_duration("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_duration("bogus") is None
