"""The providers' shared breaker: a streak of failures opens it for every process, a 429 is
pacing until its budget is spent, one probe after the cool-down, any answer closes it.

Runs on the test Redis (flushed per test): the breaker is Lua on Redis's clock, and the
real server is what the workers share. Windows are a few tenths of a second; a slow
machine only lengthens the gaps, which opens a breaker that should open and never one
that should not (those checks use windows of seconds)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import redis_url
from webctx.errors import ProviderDown, ProviderError, ProviderUnavailable, RateLimited
from webctx.net.breaker import (
    BreakerPolicy,
    Endpoint,
    GuardedSearch,
    ProviderBreaker,
    outage_message,
)

SEARCH = Endpoint("search", "searxng", "http://127.0.0.1:9/", "WEBCTX_SEARXNG_URL")
EMBED = Endpoint("embeddings", "openai", "http://127.0.0.1:8/v1", "OPENAI_BASE_URL",
                 limits="check the key's quota (OPENAI_API_KEY)")  # fmt: skip
NO_NAME = "[Errno -2] Name or service not known"
QUICK = BreakerPolicy(outage_s=0.3, rate_limit_budget_s=0.6, cooldown_s=0.3, probe_lease_s=2)


def refused() -> ProviderUnavailable:
    return ProviderUnavailable("searxng: ConnectError", kind="unreachable",
                               detail="[Errno 111] Connection refused")  # fmt: skip


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url())
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


class Provider:
    """A provider whose next answers the test sets: an error to raise, or a value."""

    def __init__(self) -> None:
        self.calls = 0
        self.fails: Exception | None = None

    def __call__(self) -> str:
        self.calls += 1
        if self.fails is not None:
            raise self.fails
        return "answer"


def breaker(
    r: redis.Redis, policy: BreakerPolicy = QUICK, endpoint: Endpoint = SEARCH
) -> ProviderBreaker:
    """A breaker on its own connection, as another worker process would have (`r` is the
    fixture's: flushed before and after)."""
    return ProviderBreaker(redis.Redis.from_url(redis_url()), endpoint, policy)


def fail(b: ProviderBreaker, provider: Provider) -> Exception:
    with pytest.raises((ProviderUnavailable, RateLimited, ProviderDown)) as info:
        b.call(provider)
    return info.value


def test_failures_shorter_than_the_outage_window_are_retried_with_the_time_left(
    r: redis.Redis,
) -> None:
    b, provider = breaker(r, BreakerPolicy(outage_s=5)), Provider()
    provider.fails = refused()
    errors = [fail(b, provider) for _ in range(5)]
    assert all(isinstance(e, ProviderUnavailable) for e in errors)
    last = errors[-1]
    assert isinstance(last, ProviderUnavailable) and last.verdict_in_s is not None
    assert 4.0 < last.verdict_in_s <= 5.1  # the retry is due when the verdict falls
    assert b.down() is None and provider.calls == 5


def test_an_endpoint_failing_for_the_window_is_down_for_every_process(r: redis.Redis) -> None:
    provider = Provider()
    provider.fails = refused()
    fail(breaker(r), provider)
    time.sleep(0.35)
    down = fail(breaker(r), provider)
    assert isinstance(down, ProviderDown)
    said = r"search provider searxng at http://127\.0\.0\.1:9 refused connections for \d+ s: "
    assert re.fullmatch(said + r"is it running\? \(WEBCTX_SEARXNG_URL\)", str(down))
    # Another process: nothing is sent, it fails at once with the same line.
    other, calls = breaker(r), provider.calls
    started = time.monotonic()
    with pytest.raises(ProviderDown) as info:
        other.call(provider)
    assert provider.calls == calls and time.monotonic() - started < 0.5
    assert str(info.value) == str(down) and info.value.url == "http://127.0.0.1:9"
    assert other.down() is not None


def test_an_answer_ends_the_streak(r: redis.Redis) -> None:
    b, provider = breaker(r), Provider()
    provider.fails = refused()
    fail(b, provider)
    provider.fails = None
    assert b.call(provider) == "answer"
    time.sleep(0.35)
    provider.fails = refused()
    assert isinstance(fail(b, provider), ProviderUnavailable)  # a new streak, not down


def test_a_refusal_with_an_answer_is_an_answer(r: redis.Redis) -> None:
    b, provider = breaker(r), Provider()
    provider.fails = refused()
    fail(b, provider)
    provider.fails = ProviderError("searxng", "HTTP 403")
    with pytest.raises(ProviderError):
        b.call(provider)
    time.sleep(0.35)
    provider.fails = refused()
    assert isinstance(fail(b, provider), ProviderUnavailable)


def open_breaker(b: ProviderBreaker, provider: Provider) -> None:
    provider.fails = refused()
    fail(b, provider)
    time.sleep(QUICK.outage_s + 0.05)
    assert isinstance(fail(b, provider), ProviderDown)


def test_after_the_cool_down_one_probe_goes_and_its_failure_opens_it_again(
    r: redis.Redis,
) -> None:
    b, provider = breaker(r), Provider()
    open_breaker(b, provider)
    time.sleep(QUICK.cooldown_s + 0.05)
    assert b.down() is None  # cooling down is over: a look alone takes no probe
    calls = provider.calls
    assert isinstance(fail(b, provider), ProviderDown)  # the probe: down again at once
    assert provider.calls == calls + 1
    assert isinstance(fail(b, provider), ProviderDown) and provider.calls == calls + 1


def test_the_others_wait_for_the_probe_and_go_once_it_answers(r: redis.Redis) -> None:
    b, provider = breaker(r), Provider()
    open_breaker(b, provider)
    time.sleep(QUICK.cooldown_s + 0.05)
    provider.fails = None
    probing, order = threading.Event(), []

    def slow_answer() -> str:
        probing.set()
        time.sleep(0.3)
        order.append("probe answered")
        return "answer"

    def waiter() -> None:
        probing.wait(5)
        breaker(r).call(lambda: order.append("waiter sent") or "answer")

    thread = threading.Thread(target=waiter)
    thread.start()
    assert b.call(slow_answer) == "answer"
    thread.join(10)
    assert order == ["probe answered", "waiter sent"]
    assert b.down() is None and r.keys("webctx:breaker:*") == []  # closed: the record is gone


def test_429s_are_pacing_until_their_budget_is_spent(r: redis.Redis) -> None:
    b, provider = breaker(r, endpoint=EMBED), Provider()
    provider.fails = RateLimited("openai: 429", retry_after=0.1)
    assert isinstance(fail(b, provider), RateLimited)
    time.sleep(0.35)  # past the outage window, within the budget: still pacing
    assert isinstance(fail(b, provider), RateLimited)
    time.sleep(0.3)
    down = fail(b, provider)
    assert isinstance(down, ProviderDown)
    assert re.match(r"embeddings provider openai at http://127\.0\.0\.1:8/v1 answered 429 "
                    r"\(rate limited\) for \d+ s: check the key's quota", str(down))  # fmt: skip


def test_a_429_asking_for_a_wait_past_the_budget_is_down_at_once(r: redis.Redis) -> None:
    b, provider = breaker(r, endpoint=EMBED), Provider()
    provider.fails = RateLimited("openai: 429", retry_after=3600)
    down = fail(b, provider)
    assert isinstance(down, ProviderDown)
    assert "answered 429 asking for a 3600 s wait: check the key's quota" in str(down)


def test_a_record_expires_and_names_no_secret(r: redis.Redis) -> None:
    secret = Endpoint("embeddings", "openai", "https://user:sk-secret@llm.example/v1?key=sk-2",
                      "OPENAI_BASE_URL")  # fmt: skip
    b, provider = breaker(r, endpoint=secret), Provider()
    provider.fails = ProviderUnavailable("openai: HTTP 502", kind="status", detail="HTTP 502")
    fail(b, provider)
    [key] = r.keys("webctx:breaker:*")
    assert b"sk-" not in key and b"user" not in key and b"llm.example" not in key
    assert 0 < r.pttl(key) <= 2 * 1000 * (QUICK.outage_s * 2 + QUICK.cooldown_s)
    assert b"sk-" not in b"".join(r.hvals(key))
    open_breaker(b, provider)
    assert 0 < r.pttl(key) <= 3600 * 1000
    down = b.down()
    assert down is not None and down.url == "https://llm.example/v1"
    assert "sk-" not in str(down) and "user" not in str(down)


@pytest.mark.parametrize(
    ("exc", "says"),
    [
        (refused(), "refused connections for {seconds} s: is it running? (WEBCTX_SEARXNG_URL)"),
        (ProviderUnavailable("x", kind="unreachable", detail=NO_NAME),
         f"could not be reached ({NO_NAME}) for {{seconds}} s: check WEBCTX_SEARXNG_URL"),
        (ProviderUnavailable("x", kind="timeout", detail="ReadTimeout"),
         "did not answer in time for {seconds} s: is it overloaded? (WEBCTX_SEARXNG_URL)"),
        (ProviderUnavailable("x", kind="status", detail="HTTP 503"),
         "answered HTTP 503 for {seconds} s: is it healthy? Check its logs (WEBCTX_SEARXNG_URL)"),
        (ProviderUnavailable("x", detail="RemoteProtocolError: " + "x" * 400),
         "failed (RemoteProtocolError: xxxx"),
    ],
)  # fmt: skip
def test_the_outage_line_names_the_provider_its_url_and_the_fix(
    exc: ProviderUnavailable, says: str
) -> None:
    long_url = Endpoint("search", "searxng", "http://searx.example/" + "p" * 300, SEARCH.setting)
    for endpoint in (SEARCH, long_url):
        line = outage_message(endpoint, exc, budget_s=20).replace("{seconds}", "5")
        assert line.startswith(f"search provider searxng at {endpoint.shown_url} ")
        assert says.replace("{seconds}", "5") in line
        assert "\n" not in line and len(line) <= 240


def test_a_guarded_provider_keeps_its_name_and_answers(r: redis.Redis) -> None:
    class Search:
        name = "searxng"

        def search(self, query: str, *, limit: int, recency_days: int | None = None) -> list:
            return []

    guarded = GuardedSearch(Search(), breaker(r))  # type: ignore[arg-type]
    assert guarded.name == "searxng" and guarded.search("q", limit=3) == []

