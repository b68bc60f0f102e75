"""Shared Redis rate limiter: both limits, reserve-before-send, 429 pause, header feedback.

Runs on the test Redis (flushed per test): the limiter is Lua, and the real
server is what the workers share."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import redis

from tests.conftest import redis_url
from webctx.errors import ConfigError, RateLimited
from webctx.net import ratelimit
from webctx.net.ratelimit import RedisRateLimiter, limiter_namespace
from webctx.protocols import Embeddings
from webctx.stages.embed import LimitedEmbedder

# Windows of a fraction of a second: these run alone (make test), not beside other tests.
pytestmark = pytest.mark.serial


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url())
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def make(r: redis.Redis, **kwargs: object) -> RedisRateLimiter:
    return RedisRateLimiter(r, limiter_namespace("http://x/v1", "m", "sk-secret"), **kwargs)  # type: ignore[arg-type]


def test_namespace_hashes_the_key_and_separates_triples() -> None:
    ns = limiter_namespace("http://x/v1", "m", "sk-secret")
    assert "sk-secret" not in ns
    assert ns != limiter_namespace("http://x/v1", "m", "sk-other")
    assert ns != limiter_namespace("http://x/v1", "m2", "sk-secret")


def test_requests_per_window_block_until_the_oldest_leaves(r: redis.Redis) -> None:
    lim = make(r, rpm=3, window_s=0.5)
    start = time.monotonic()
    for _ in range(3):
        granted = lim.acquire(1)
        lim.settle(granted)  # answered at once
        assert granted.waited_s < 0.05
    lim.acquire(1)
    assert 0.45 <= time.monotonic() - start < 0.9


def test_tokens_per_window_block_and_refused_requests_free_their_tokens(r: redis.Redis) -> None:
    lim = make(r, tpm=100, window_s=0.4)
    first = lim.acquire(80)
    with pytest.raises(RateLimited) as info:
        lim.acquire(30, max_wait_s=0.05)
    assert info.value.retry_after is not None and 0.2 < info.value.retry_after <= 0.4
    lim.settle(first, sent=False)  # a 429: the provider did not count it
    assert lim.acquire(30).waited_s < 0.05


def test_a_request_still_in_flight_past_its_window_holds_its_slot_until_answered(
    r: redis.Redis,
) -> None:
    # The server counts a request from when it arrived: a sender held up after its
    # reservation must not let another request into the same server window.
    lim = make(r, rpm=1, window_s=0.2)
    held = lim.acquire(1)
    time.sleep(0.3)
    with pytest.raises(RateLimited):
        lim.acquire(1, max_wait_s=0.1)
    lim.settle(held)  # answered now: the slot frees one window after the answer
    start = time.monotonic()
    lim.acquire(1)
    assert 0.15 <= time.monotonic() - start < 0.5


def test_a_request_whose_sender_died_in_flight_frees_its_slot(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ratelimit, "_FLIGHT_MAX_MS", 300)
    lim = make(r, rpm=1, window_s=0.1)
    lim.acquire(1)  # never settled: its process is gone
    start = time.monotonic()
    lim.acquire(1)
    assert 0.25 <= time.monotonic() - start < 0.8


def test_a_request_larger_than_the_token_limit_is_a_config_error(r: redis.Redis) -> None:
    with pytest.raises(ConfigError):
        make(r, tpm=100).acquire(101)


def test_pause_holds_every_limiter_of_the_key(r: redis.Redis) -> None:
    a, b = make(r, rpm=1000), make(r, rpm=1000)
    a.pause(0.3)
    assert 0.2 < b.paused_for() <= 0.3
    start = time.monotonic()
    b.acquire(1)
    assert time.monotonic() - start >= 0.29
    a.pause(0.01)
    a.pause(0.2)
    assert b.paused_for() > 0.1  # a shorter pause never shortens a longer one


def test_limits_are_learned_from_headers_when_not_configured(r: redis.Redis) -> None:
    lim = make(r, window_s=0.3)
    lim.observe({"x-ratelimit-limit-requests": "2", "x-ratelimit-limit-tokens": "1000"})
    assert make(r).learned() == {"rpm": 2, "tpm": 1000}
    lim.settle(lim.acquire(1))
    lim.settle(lim.acquire(1))
    start = time.monotonic()
    lim.acquire(1)
    assert time.monotonic() - start > 0.2


def test_usage_the_server_saw_from_other_clients_is_counted(r: redis.Redis) -> None:
    lim = make(r, tpm=1000, window_s=0.5)
    lim.observe(
        {
            "x-ratelimit-limit-tokens": "1000",
            "x-ratelimit-remaining-tokens": "100",
            "x-ratelimit-reset-tokens": "300ms",
        }
    )
    with pytest.raises(RateLimited):
        lim.acquire(200, max_wait_s=0.05)
    time.sleep(0.32)
    assert lim.acquire(200).waited_s < 0.05


def test_threads_never_exceed_the_limit_in_any_window(r: redis.Redis) -> None:
    rpm, window = 10, 0.5
    stamps: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        lim = make(r, rpm=rpm, window_s=window)
        for _ in range(5):
            granted = lim.acquire(1)
            lim.settle(granted)  # answered at once
            with lock:
                stamps.append(granted.at_ms)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stamps.sort()
    assert len(stamps) == 30
    for i, at in enumerate(stamps):
        in_window = [s for s in stamps[i:] if s < at + window * 1000]
        assert len(in_window) <= rpm


class AnsweringEmbedder:
    """Answers every call with the given rate-limit headers, or refuses it with a 429."""

    model = "m"

    def __init__(self, limits: dict[str, str], *, refuse: bool = False,
                 retry_after: float = 0.01) -> None:  # fmt: skip
        self.limits, self.refuse, self.retry_after = limits, refuse, retry_after

    def embed(self, texts: Sequence[str]) -> Embeddings:
        if self.refuse:
            raise RateLimited("429", retry_after=self.retry_after, rate_limits=self.limits)
        return Embeddings([[1.0] for _ in texts], self.limits)


def test_a_limited_embedder_learns_from_the_headers_of_each_answer(r: redis.Redis) -> None:
    limiter = make(r)
    headers = {"x-ratelimit-limit-requests": "7", "x-ratelimit-limit-tokens": "900"}
    assert LimitedEmbedder(AnsweringEmbedder(headers), limiter).embed(["a"]).vectors == [[1.0]]
    assert limiter.learned() == {"rpm": 7, "tpm": 900}


def test_a_limited_embedder_learns_from_a_429_too(r: redis.Redis) -> None:
    limiter = make(r)
    # A pause long enough to be still running when read back on a loaded machine.
    refused = AnsweringEmbedder({"x-ratelimit-limit-requests": "5"}, refuse=True, retry_after=30)
    with pytest.raises(RateLimited):
        LimitedEmbedder(refused, limiter).embed(["a"])
    assert limiter.learned() == {"rpm": 5}
    assert limiter.paused_for() > 0
