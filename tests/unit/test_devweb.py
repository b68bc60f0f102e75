"""The loopback peers themselves: the embeddings API's limits and shapes, the dev SearxNG."""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from webctx.adapters.hash_embedder import HashEmbedder
from webctx.devweb.embeddings import (
    EmbeddingsControl,
    SlidingWindow,
    embeddings_control,
    format_duration,
    make_embeddings_app,
)
from webctx.devweb.searxng import SearchDoc, make_searxng_app, searxng_control
from webctx.devweb.server import LoopbackServer

MODEL = "m-test"
HASH = HashEmbedder(dimensions=32)
LIMIT_HEADERS = {
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
}


Limited = tuple[httpx.Client, EmbeddingsControl]


@pytest.fixture
def limited() -> Iterator[Limited]:
    """An embeddings API allowing 5 requests and 1000 tokens a second, 3 inputs and 50 tokens
    a request, and a client for it."""
    app = make_embeddings_app(
        HASH.vectors,
        model=MODEL,
        rpm=5,
        tpm=1000,
        max_inputs=3,
        max_tokens_per_request=50,
        window_s=1.0,
    )
    with LoopbackServer(app) as server, httpx.Client(base_url=server.url, timeout=5) as client:
        yield client, embeddings_control(app)


def post(client: httpx.Client, inputs: object, **extra: object) -> httpx.Response:
    return client.post("/v1/embeddings", json={"model": MODEL, "input": inputs, **extra})


def test_burst_accepts_exactly_rpm_requests(limited: Limited) -> None:
    client, control = limited
    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(lambda _: post(client, "hi"), range(12)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 5 + [429] * 7
    for resp in responses:
        assert LIMIT_HEADERS <= set(resp.headers)
    rejected = next(r for r in responses if r.status_code == 429)
    assert 1 <= int(rejected.headers["retry-after"]) <= 1
    assert 0 < int(rejected.headers["retry-after-ms"]) <= 1000
    assert rejected.headers["x-ratelimit-remaining-requests"] == "0"
    assert rejected.json()["error"]["code"] == "rate_limit_exceeded"
    assert control.stats.rejected_429 == 7


def test_sustained_hammering_never_exceeds_rpm() -> None:
    app = make_embeddings_app(HASH.vectors, model=MODEL, rpm=3, tpm=None, window_s=0.25)
    accepted = 0
    with LoopbackServer(app) as server, httpx.Client(base_url=server.url) as client:
        started = time.monotonic()
        while time.monotonic() - started < 0.6:
            accepted += post(client, "hi").status_code == 200
        elapsed = time.monotonic() - started
    assert 3 < accepted <= 3 * (int(elapsed / 0.25) + 1)
    assert embeddings_control(app).stats.rejected_429 > 0


def test_token_limit_answers_429_until_tokens_age_out() -> None:
    app = make_embeddings_app(HASH.vectors, model=MODEL, rpm=None, tpm=30, window_s=0.3)
    with LoopbackServer(app) as server, httpx.Client(base_url=server.url) as client:
        twenty = " ".join(["word"] * 20)  # 20 tokens
        assert post(client, twenty).status_code == 200
        refused = post(client, twenty)
        assert refused.status_code == 429
        assert refused.headers["x-ratelimit-remaining-tokens"] == "10"
        assert "x-ratelimit-limit-requests" not in refused.headers  # no request limit set
        time.sleep(int(refused.headers["retry-after-ms"]) / 1000)
        assert post(client, twenty).status_code == 200


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([], "'$.input' is invalid"),
        ("", "'$.input' is invalid"),
        (["a", "b", "c", "d"], "Too many inputs"),
        ([" ".join(["word"] * 30), " ".join(["word"] * 30)], "max 50 tokens per request"),
        ([[15339, 100_256]], "invalid token ids"),  # past cl100k's vocabulary
        ([[-1]], "invalid token ids"),
        ([[45918]], "invalid token ids"),  # the first bytes of "語" only
    ],
)
def test_bad_requests_get_openai_error_shape(
    limited: Limited, inputs: object, message: str
) -> None:
    client, _ = limited
    resp = post(client, inputs)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and message in error["message"]
    assert LIMIT_HEADERS <= set(resp.headers)
    assert resp.headers["x-ratelimit-remaining-requests"] == "5"  # refusals cost nothing


def test_response_body_matches_openai_and_base64_decodes(
    limited: Limited,
) -> None:
    client, _ = limited
    plain = post(client, ["alpha beta", "gamma"]).json()
    assert set(plain) == {"object", "data", "model", "usage"}
    assert plain["object"] == "list" and plain["model"] == MODEL
    assert plain["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert [d["index"] for d in plain["data"]] == [0, 1]
    assert plain["data"][0]["object"] == "embedding"
    encoded = post(client, ["alpha beta", "gamma"], encoding_format="base64").json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in encoded["data"]]
    np.testing.assert_allclose(decoded, [d["embedding"] for d in plain["data"]], atol=1e-6)


def test_token_id_inputs_are_embedded_as_their_text(limited: Limited) -> None:
    client, _ = limited
    by_ids = post(client, [[15339, 1917]]).json()  # cl100k's "hello world"
    by_text = post(client, ["hello world"]).json()
    assert by_ids["data"][0]["embedding"] == by_text["data"][0]["embedding"]
    assert by_ids["usage"]["prompt_tokens"] == 2


def test_models_listing(limited: Limited) -> None:
    client, _ = limited
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL]


def test_latency_is_added() -> None:
    app = make_embeddings_app(HASH.vectors, model=MODEL, rpm=None, tpm=None, latency_s=0.2)
    with LoopbackServer(app) as server, httpx.Client(base_url=server.url) as client:
        started = time.monotonic()
        assert post(client, "hi").status_code == 200
        assert time.monotonic() - started >= 0.2


def test_sliding_window_never_admits_more_than_rpm_in_any_window() -> None:
    window = SlidingWindow(rpm=5, tpm=None, window_s=1.0)
    rng = random.Random(7)
    now, admitted = 0.0, []
    for _ in range(2000):
        now += rng.expovariate(20)  # ~20 requests a second against a limit of 5
        if window.admit(1, now) is None:
            admitted.append(now)
    assert len(admitted) > 400
    assert all(
        later - earlier >= 1.0 for earlier, later in zip(admitted, admitted[5:], strict=False)
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.017, "17ms"), (1.0, "1s"), (8.64, "8.64s"), (360.0, "6m0s"), (3723.5, "1h2m3.5s")],
)
def test_format_duration_like_openai(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_searxng_shape_paging_and_title_boost() -> None:
    docs = [
        SearchDoc("https://a.example/", "Other", "kafka kafka streams", published="2024-01-01"),
        SearchDoc("https://b.example/", "Kafka", "streams"),
    ] + [SearchDoc(f"https://f.example/{i}", f"F{i}", "kafka") for i in range(12)]
    app = make_searxng_app(docs, results_per_page=10)
    with LoopbackServer(app) as server, httpx.Client(base_url=server.url) as client:
        first = client.get("/search", params={"q": "kafka", "format": "json"}).json()
        second = client.get("/search", params={"q": "kafka", "format": "json", "pageno": 2})
        assert client.get("/search", params={"q": "kafka", "format": "csv"}).status_code == 403
    assert first["query"] == "kafka" and first["number_of_results"] == 14
    assert first["results"][0]["url"] == "https://b.example/"  # a title hit outranks body hits
    assert {"url", "title", "content", "engine", "score", "publishedDate"} <= set(
        first["results"][0]
    )
    assert len(first["results"]) == 10 and len(second.json()["results"]) == 4
    assert searxng_control(app).requests == 3


def test_the_peers_fail_forever_until_they_recover_and_a_stopped_one_refuses() -> None:
    """The faults of a provider that is down: 500 or 429 (with retry-after) on every request,
    and a server that is not listening, then back on the same URL."""
    embeddings = make_embeddings_app(HASH.vectors, model=MODEL, rpm=None, tpm=None)
    search = make_searxng_app([SearchDoc("https://a.example/", "A", "kafka")])
    control = embeddings_control(embeddings)
    with LoopbackServer(embeddings) as server, httpx.Client(base_url=server.url) as client:
        control.fail_always(status=429, retry_after=1.0)
        answers = [post(client, ["a"]) for _ in range(5)]
        assert {a.status_code for a in answers} == {429}
        assert {a.headers["retry-after"] for a in answers} == {"1"}
        control.fail_always(status=500)
        assert post(client, ["a"]).status_code == 500
        control.recover()
        assert post(client, ["a"]).status_code == 200
        assert control.stats.injected == 6
    faults = searxng_control(search)
    server = LoopbackServer(search).start()
    params = {"q": "kafka", "format": "json"}
    try:
        faults.fail_always(status=502)
        assert [httpx.get(server.url + "/search", params=params).status_code
                for _ in range(3)] == [502] * 3  # fmt: skip
        faults.recover()
        url = server.url
        server.stop()
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/search", params=params, timeout=2)
        server.start()  # a restarted instance: the same URL answers again
        assert server.url == url
        assert httpx.get(url + "/search", params=params).json()["results"]
    finally:
        server.stop()
