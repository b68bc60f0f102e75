"""The shared circuit breaker of the providers a job calls (search, embeddings), in Redis.

Every process calling one provider endpoint (provider + base URL) consults one record
before each call and reports how the call went, so an outage seen by one worker is known
to all of them, and to the next job:

    webctx:breaker:{provider}:{endpoint}   HASH (endpoint: a digest of the base URL)
        since        ms (Redis TIME) of the first failure with no answer since
        failures     failures since then
        kind         the last one's: unreachable, timeout, status, rate_limited
        open_until   ms; while before it, every call fails at once (open)
        probe_until  ms; after `open_until`, one call (the probe) may go until then
        reason       the one-line outage message, set when it opened

- Closed: calls go. A transport failure, a timeout or a 5xx starts (or extends) the
  streak; one `outage_s` after the streak began, the next such failure opens the breaker.
  A 429 is pacing (the shared rate limiter waits out its `retry-after`), so 429s open it
  only once they have lasted `rate_limit_budget_s` (or one asks for a wait past it).
  Between failures `ProviderUnavailable.verdict_in_s` says when the verdict falls, so a
  retry comes by then: the time to give up is this deadline, not retries times backoff.
- Open: the call raises ProviderDown (the stored reason) without sending anything.
- Half-open, `cooldown_s` after it opened: one caller probes; the others wait for its
  answer (at most its lease). A failed probe opens it again at once; any answer (a 4xx
  too: the provider is there) deletes the record, and the breaker is closed.

The record expires (a streak after twice its window without a failure, an open breaker an
hour after its last failure), so a provider not called for a while is tried afresh.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis

from webctx.errors import ProviderDown, ProviderError, ProviderUnavailable, RateLimited
from webctx.models import SearchResult
from webctx.protocols import Embedder, Embeddings, SearchProvider

T = TypeVar("T")
_OPEN_TTL_MS = 3600 * 1000
_URL_SHOWN = 80
_WAIT_STEP_S = 0.05

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: record. ARGV: probe lease ms, peek (1: never take the probe).
# -> {0, streak 0|1} closed, {1, ms left, reason} open, {2} probe now, {3, ms} wait
_ADMIT = (
    _NOW
    + """
local r = redis.call('HMGET', KEYS[1], 'open_until', 'probe_until', 'since', 'reason')
local open_until = tonumber(r[1] or '0')
if open_until == 0 then return {0, r[3] and 1 or 0} end
if now < open_until then return {1, open_until - now, r[4] or ''} end
if ARGV[2] == '1' then return {0, 1} end
local probe_until = tonumber(r[2] or '0')
if probe_until > now then return {3, probe_until - now} end
redis.call('HSET', KEYS[1], 'probe_until', now + tonumber(ARGV[1]))
return {2, 0}
"""
)

# KEYS: record. ARGV: kind, reason (with "{seconds}"), outage ms, budget ms, cooldown ms,
# retry-after ms, streak ttl ms, open ttl ms. -> {opened 0|1, verdict in ms, reason}
_FAIL = (
    _NOW
    + """
local was_open = redis.call('HGET', KEYS[1], 'open_until')
redis.call('HSETNX', KEYS[1], 'since', now)
local since = tonumber(redis.call('HGET', KEYS[1], 'since'))
redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('HSET', KEYS[1], 'kind', ARGV[1])
local span = now - since
local window = tonumber(ARGV[3])
local over = span >= window
if ARGV[1] == 'rate_limited' then  -- the wait it asks for must end within the budget
  window = tonumber(ARGV[4]) - tonumber(ARGV[6])
  over = span > window
end
if was_open or over then
  local reason = string.gsub(ARGV[2], '{seconds}', tostring(math.floor(span / 1000 + 0.5)))
  redis.call('HSET', KEYS[1], 'open_until', now + tonumber(ARGV[5]), 'probe_until', 0,
             'reason', reason)
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[8]))
  return {1, 0, reason}
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[7]))
return {0, window - span, ''}
"""
)


@dataclass(frozen=True)
class Endpoint:
    """A provider endpoint as the breaker keys it and its outage message names it."""

    role: str
    """What it is to a job: "search" or "embeddings"."""
    provider: str
    """The adapter's name: "searxng", "ddgs", "openai"."""
    url: str
    """Its base URL (credentials and query are never keyed nor shown)."""
    setting: str
    """The environment variable that points at it (the fix names it)."""
    limits: str = ""
    """What to do when it rate-limits us for good (the fix of a 429 past the budget)."""

    @property
    def shown_url(self) -> str:
        """The URL without user info or query, cut to a readable length."""
        return _public_url(self.url)

    @property
    def digest(self) -> str:
        """The record's key part: provider and public URL, hashed (no secret in a key)."""
        raw = f"{self.provider}\x00{self.shown_url}"
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BreakerPolicy:
    """When an endpoint counts as down, and for how long before it is probed."""

    outage_s: float = 5.0
    rate_limit_budget_s: float = 15.0
    cooldown_s: float = 5.0
    probe_lease_s: float = 15.0
    """How long the probe may take (the provider's request timeout) before another try."""


@dataclass(frozen=True)
class _Admission:
    recorded: bool  # a streak or an outage is on record: an answer clears it


class ProviderBreaker:
    """One endpoint's breaker, shared by every process on the same Redis."""

    def __init__(
        self,
        client: redis.Redis,
        endpoint: Endpoint,
        policy: BreakerPolicy,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint, self.policy = endpoint, policy
        self._key = f"webctx:breaker:{endpoint.provider}:{endpoint.digest}"
        self._client, self._sleep = client, sleep
        self._admit = client.register_script(_ADMIT)
        self._fail = client.register_script(_FAIL)

    def call(self, request: Callable[[], T]) -> T:
        """`request()` unless the endpoint is known to be down (ProviderDown, nothing sent);
        its failure is recorded (ProviderDown when it opens the breaker, else the error with
        `verdict_in_s`), its answer closes the breaker."""
        admission = self._admission()
        try:
            result = request()
        except (ProviderUnavailable, RateLimited) as exc:
            down = self._failed(exc)
            if down is not None:
                raise down from exc
            raise
        except ProviderDown:
            raise
        except ProviderError:  # a 4xx: refused, but answered
            self._answered(admission)
            raise
        self._answered(admission)
        return result

    def down(self) -> ProviderDown | None:
        """The outage while the breaker is open and cooling down, else None (no probe)."""
        state = self._admit(keys=[self._key], args=[self._lease_ms, 1])
        return self._down(state[2]) if int(state[0]) == 1 else None

    def _admission(self) -> _Admission:
        """Go (closed, or this call probes), ProviderDown (open), or wait for a probe."""
        give_up = time.monotonic() + self.policy.probe_lease_s
        while True:
            state = self._admit(keys=[self._key], args=[self._lease_ms, 0])
            code = int(state[0])
            if code == 0:
                return _Admission(recorded=bool(int(state[1])))
            if code == 1:
                raise self._down(state[2])
            if code == 2:
                return _Admission(recorded=True)
            if time.monotonic() > give_up:  # the probe's process died: its lease ends soon
                return _Admission(recorded=True)
            self._sleep(min(_WAIT_STEP_S, int(state[1]) / 1000))

    def _failed(self, exc: ProviderUnavailable | RateLimited) -> ProviderDown | None:
        """Record a failure; the outage when it opened the breaker."""
        p = self.policy
        if isinstance(exc, RateLimited):
            kind, retry_after = "rate_limited", exc.retry_after or 0.0
        else:
            kind, retry_after = exc.kind, 0.0
        window = p.rate_limit_budget_s if kind == "rate_limited" else p.outage_s
        message = outage_message(self.endpoint, exc, budget_s=p.rate_limit_budget_s)
        args: list[str | int] = [kind, message, _ms(p.outage_s),
                _ms(p.rate_limit_budget_s), _ms(p.cooldown_s), _ms(retry_after),
                _ms(2 * window + p.cooldown_s), _OPEN_TTL_MS]  # fmt: skip
        opened, verdict_ms, reason = self._fail(keys=[self._key], args=args)
        if int(opened):
            return self._down(reason)
        if isinstance(exc, ProviderUnavailable):
            exc.verdict_in_s = int(verdict_ms) / 1000 + _WAIT_STEP_S
        return None

    def _answered(self, admission: _Admission) -> None:
        if admission.recorded:
            self._client.delete(self._key)

    def _down(self, reason: object) -> ProviderDown:
        text = reason.decode() if isinstance(reason, bytes) else str(reason or "")
        url = self.endpoint.shown_url
        return ProviderDown(self.endpoint.provider, text or f"{self.endpoint.role} provider "
                            f"{self.endpoint.provider} at {url} is down", url=url)  # fmt: skip

    @property
    def _lease_ms(self) -> int:
        return _ms(self.policy.probe_lease_s)


def outage_message(
    endpoint: Endpoint, exc: ProviderUnavailable | RateLimited, *, budget_s: float
) -> str:
    """The one line (about 200 characters) a job fails with when `endpoint` is down: who,
    where, what it did for how long ("{seconds}", filled in when it opens), the fix.
    `budget_s`: the 429s' budget (a 429 asking for a longer wait says so)."""
    if isinstance(exc, RateLimited):
        what, fix = "answered 429 (rate limited)", endpoint.limits or f"({endpoint.setting})"
        if exc.retry_after is not None and exc.retry_after > budget_s:
            what = f"answered 429 asking for a {exc.retry_after:.0f} s wait"
    elif exc.kind == "unreachable" and "refused" in exc.detail.lower():
        what, fix = "refused connections", f"is it running? ({endpoint.setting})"
    elif exc.kind == "unreachable":
        what, fix = f"could not be reached ({_short(exc.detail)})", f"check {endpoint.setting}"
    elif exc.kind == "timeout":
        what, fix = "did not answer in time", f"is it overloaded? ({endpoint.setting})"
    elif exc.kind == "status":
        what = f"answered {_short(exc.detail)}"
        fix = f"is it healthy? Check its logs ({endpoint.setting})"
    else:
        what, fix = f"failed ({_short(exc.detail)})", f"is it healthy? ({endpoint.setting})"
    where = f" at {endpoint.shown_url}" if endpoint.url else ""
    lasted = "" if what.endswith(" wait") else " for {seconds} s"
    return f"{endpoint.role} provider {endpoint.provider}{where} {what}{lasted}: {fix}"


def _public_url(url: str) -> str:
    """`url` without user info, query or fragment, at most `_URL_SHOWN` characters."""
    try:
        parts = urlsplit(url.strip())
        netloc = parts.netloc.rsplit("@", 1)[-1]
        public = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    except ValueError:
        public = "(unparsable URL)"
    return public if len(public) <= _URL_SHOWN else public[: _URL_SHOWN - 1] + "…"


def _short(text: str) -> str:
    """One line of at most 60 characters."""
    line = " ".join(text.split())
    return line if len(line) <= 60 else line[:59] + "…"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class GuardedSearch:
    """A SearchProvider whose every query goes through its endpoint's breaker."""

    def __init__(self, inner: SearchProvider, breaker: ProviderBreaker) -> None:
        self.inner, self.breaker = inner, breaker
        self.name = inner.name

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """The inner provider's results, unless it is known to be down (ProviderDown)."""
        return self.breaker.call(
            lambda: self.inner.search(query, limit=limit, recency_days=recency_days)
        )


class GuardedEmbedder:
    """An Embedder on an API whose every request goes through its endpoint's breaker."""

    in_process = False

    def __init__(self, inner: Embedder, breaker: ProviderBreaker) -> None:
        self.inner, self.breaker = inner, breaker
        self.model = inner.model
        self.dimensions: int | None = getattr(inner, "dimensions", None)

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """The inner embedder's vectors, unless it is known to be down (ProviderDown)."""
        return self.breaker.call(lambda: self.inner.embed(texts))

    def warm(self) -> None:
        """Build the inner client now, if it builds one lazily."""
        warm = getattr(self.inner, "warm", None)
        if callable(warm):
            warm()

    def close(self) -> None:
        """Close the inner client, if it has one."""
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()
