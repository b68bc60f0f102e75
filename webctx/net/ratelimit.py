"""One requests-and-tokens limiter per (provider base URL, model, API key), shared in Redis.

Every worker process that embeds with the same key shares one sliding-window log:

    {ns}:ev     ZSET  member "<id>:<tokens>", score = ms (Redis TIME) the request was sent,
                      re-stamped to when its answer arrived (the server admitted it in between)
    {ns}:fly    ZSET  the same members while in flight (sent, not answered), score = sent
    {ns}:sum    STR   tokens in the log (kept with the log inside the scripts)
    {ns}:pause  STR   present while a 429 pauses the key; its PTTL is the pause
    {ns}:lim    HASH  rpm / tpm learned from x-ratelimit-limit-* headers

`{ns}` is `webctx:rl:` + sha256(base_url, model, api_key)[:24]; the key itself is never
stored. Each step is one Lua script, so "check both limits, then reserve" is atomic
across processes and a window never admits more than the limit (a token bucket would
admit up to twice the limit over some window). Time is Redis's clock, not the workers'.
A request still in flight never leaves the log, however old its send stamp: the server
counts it from when it arrived, which can be later than the send stamp by as long as the
sending process was held up; one in flight past `_FLIGHT_MAX_MS` (its process died)
does leave.

The provider's rate-limit headers are read here too (`rate_limit_headers`,
`retry_after_s`, `parse_duration`): the limiter learns from them, and the embeddings
adapter uses them to translate a 429.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis

from webctx.errors import ConfigError, RateLimited

logger = logging.getLogger(__name__)
_LEARNED_TTL_S = 24 * 3600
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_FLIGHT_MAX_MS = 120_000
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: ev sum pause lim fly. ARGV: rpm tpm window_ms tokens id flight_max_ms ttl_ms.
# -> {1, now} or {0, wait_ms}
_ACQUIRE = (
    _NOW
    + """
local pause = redis.call('PTTL', KEYS[3])
if pause > 0 then return {0, pause} end
local window = tonumber(ARGV[3])
local rpm = tonumber(ARGV[1])
if rpm <= 0 then rpm = tonumber(redis.call('HGET', KEYS[4], 'rpm') or '0') end
local tpm = tonumber(ARGV[2])
if tpm <= 0 then tpm = tonumber(redis.call('HGET', KEYS[4], 'tpm') or '0') end
local tokens = tonumber(ARGV[4])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window)
local freed = 0
local lost = now - tonumber(ARGV[6])
for _, m in ipairs(old) do
  local sent = redis.call('ZSCORE', KEYS[5], m)
  if (not sent) or tonumber(sent) <= lost then
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', KEYS[5], m)
    freed = freed + tonumber(string.match(m, ':(%d+)$'))
  end
end
if freed > 0 then redis.call('DECRBY', KEYS[2], freed) end
local count = redis.call('ZCARD', KEYS[1])
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
local wait = 0
local over = false
if rpm > 0 and count >= rpm then
  over = true
  local e = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')
  wait = math.max(wait, tonumber(e[2]) + window - now)
end
if tpm > 0 and used + tokens > tpm then
  over = true
  local excess = used + tokens - tpm
  local evs = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  local w = window
  for i = 1, #evs, 2 do
    excess = excess - tonumber(string.match(evs[i], ':(%d+)$'))
    if excess <= 0 then w = tonumber(evs[i + 1]) + window - now; break end
  end
  wait = math.max(wait, w)
end
-- A slot held by a request still in flight past its window frees when it is answered.
if over then
  if wait <= 0 then wait = 5 end
  return {0, wait}
end
redis.call('ZADD', KEYS[1], now, ARGV[5] .. ':' .. tokens)
redis.call('ZADD', KEYS[5], now, ARGV[5] .. ':' .. tokens)
redis.call('INCRBY', KEYS[2], tokens)
local keep = tonumber(ARGV[7])
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('PEXPIRE', KEYS[5], keep)
return {1, now}
"""
)

# KEYS: ev sum fly. ARGV: member keep(1|0) ttl_ms. Re-stamp an answered request to now,
# or drop one the server refused (a 429 is not counted in the provider's window).
_SETTLE = (
    _NOW
    + """
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[2] == '1' then
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', now, ARGV[1]) == 1 then
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
    redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
  end
elseif redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('DECRBY', KEYS[2], tonumber(string.match(ARGV[1], ':(%d+)$')))
end
return now
"""
)

# KEYS: pause. ARGV: ms. Extend (never shorten) the pause of the key.
_PAUSE = """
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then redis.call('SET', KEYS[1], '1', 'PX', ms) end
return ms
"""

# KEYS: ev sum. ARGV: server_used window_ms reset_ms id. Usage the server saw that the log
# lacks (another client of the key) becomes one event that leaves when the server resets.
_RECONCILE = (
    _NOW
    + """
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
local deficit = tonumber(ARGV[1]) - used
if deficit <= 0 then return 0 end
local window = tonumber(ARGV[2])
local at = now + math.min(tonumber(ARGV[3]), window) - window
redis.call('ZADD', KEYS[1], at, ARGV[4] .. ':' .. deficit)
redis.call('INCRBY', KEYS[2], deficit)
redis.call('PEXPIRE', KEYS[1], window * 2)
redis.call('PEXPIRE', KEYS[2], window * 2)
return deficit
"""
)


def limiter_namespace(base_url: str | None, model: str, api_key: str | None) -> str:
    """Redis key prefix of one (base URL, model, key) triple; the key only as a hash."""
    raw = "\x00".join((base_url or "https://api.openai.com/v1", model, api_key or ""))
    return "webctx:rl:" + hashlib.sha256(raw.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Reservation:
    """A granted slot: the log member to settle once the answer is in."""

    member: str
    tokens: int
    waited_s: float
    at_ms: int  # Redis time of the grant


class RedisRateLimiter:
    """Requests-per-window and tokens-per-window for all processes sharing one key.

    `rpm`/`tpm` None: learned from the server's x-ratelimit-limit-* headers (no limit on
    that axis until a response has told it). `window_s` is 60 for OpenAI's per-minute limits.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        window_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if (rpm is not None and rpm < 1) or (tpm is not None and tpm < 1) or window_s <= 0:
            raise ConfigError("rate limits and window must be positive")
        self.rpm, self.tpm, self.window_ms = rpm, tpm, int(window_s * 1000)
        self._keys = [f"{namespace}:{k}" for k in ("ev", "sum", "pause", "lim", "fly")]
        self._sleep = sleep
        self._client = client
        self._acquire = client.register_script(_ACQUIRE)
        self._settle = client.register_script(_SETTLE)
        self._pause = client.register_script(_PAUSE)
        self._reconcile = client.register_script(_RECONCILE)

    def acquire(self, tokens: int, *, max_wait_s: float | None = None) -> Reservation:
        """Block until a request of `tokens` fits both limits, and reserve it.

        Raises RateLimited(retry_after) instead when the wait would exceed `max_wait_s`."""
        tpm = self.tpm or self.learned().get("tpm")
        if tpm is not None and tokens > tpm:
            raise ConfigError(f"a request of {tokens} tokens can never fit a {tpm} TPM limit")
        member_id = uuid.uuid4().hex[:16]
        args: list[int | str] = [
            self.rpm or 0, self.tpm or 0, self.window_ms, tokens, member_id, _FLIGHT_MAX_MS,
            self._ttl_ms(),
        ]
        started = time.monotonic()
        while True:
            granted, value = self._acquire(keys=self._keys, args=args)
            if granted:
                waited = time.monotonic() - started
                return Reservation(f"{member_id}:{tokens}", tokens, waited, int(value))
            wait_s = int(value) / 1000
            if max_wait_s is not None and time.monotonic() - started + wait_s > max_wait_s:
                raise RateLimited("shared rate limit: wait too long", retry_after=wait_s)
            # Jitter spreads the processes that all wait for the same slot to free.
            self._sleep(wait_s + random.uniform(0.001, 0.002 + wait_s * 0.02))

    def settle(self, reservation: Reservation, *, sent: bool = True) -> None:
        """Mark a reserved request answered (`sent`), or refused with 429 (not counted)."""
        keep = "1" if sent else "0"
        keys = [self._keys[0], self._keys[1], self._keys[4]]
        self._settle(keys=keys, args=[reservation.member, keep, self._ttl_ms()])

    def _ttl_ms(self) -> int:
        """How long the log outlives its last change: a window past the last event, and
        never less than a request may stay in flight."""
        return max(self.window_ms * 2, _FLIGHT_MAX_MS)

    def pause(self, seconds: float) -> None:
        """Hold every process off this key for `seconds` (after a 429)."""
        ms = max(1, int(seconds * 1000))
        self._pause(keys=[self._keys[2]], args=[ms])
        logger.warning("embedding key paused", extra={"pause_s": round(seconds, 3)})

    def paused_for(self) -> float:
        """Seconds left of the current pause (0 when not paused)."""
        ms = int(self._client.pttl(self._keys[2]))
        return max(0.0, ms / 1000)

    def learned(self) -> dict[str, int]:
        """Limits learned from response headers."""
        raw = self._client.hgetall(self._keys[3])
        return {_text(k): int(v) for k, v in raw.items()}

    def observe(self, headers: Mapping[str, str]) -> None:
        """Adapt to a response's x-ratelimit-* headers: learn the limits not configured, and
        count token usage the server saw but the log lacks (another client of the key).

        `remaining == 0` alone does not pause: the log already waits for the exact slot,
        and the server's reset is when its *whole* window clears, far too long to wait."""
        for kind, field in (("requests", "rpm"), ("tokens", "tpm")):
            limit = _int(headers.get(f"x-ratelimit-limit-{kind}"))
            remaining = _int(headers.get(f"x-ratelimit-remaining-{kind}"))
            reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}", "")) or 0.0
            if limit is None:
                continue
            if getattr(self, field) is None and self.learned().get(field) != limit:
                self._client.hset(self._keys[3], field, limit)
                self._client.expire(self._keys[3], _LEARNED_TTL_S)
            if kind == "tokens" and remaining is not None:
                used, reset_ms = limit - remaining, int(reset * 1000)
                args: list[int | str] = [used, self.window_ms, reset_ms, uuid.uuid4().hex[:16]]
                self._reconcile(keys=self._keys[:2], args=args)


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# -- the provider's rate-limit headers ----------------------------------------------------
def parse_duration(value: str) -> float | None:
    """Seconds in an OpenAI reset duration such as "1s", "6m0s", "17ms"; None if unparsable."""
    parts = _DURATION_PART.findall(value.strip())
    if not parts or "".join(n + u for n, u in parts) != value.strip():
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """How long a 429 asks us to wait, from the most precise header present."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return max(0.0, float(headers.get(name, "")) * scale)
        except ValueError:
            continue  # absent, or an HTTP date: OpenAI sends delta-seconds
    # No retry-after: wait for whichever exhausted limit resets last.
    waits = [
        parse_duration(headers.get(f"x-ratelimit-reset-{kind}", ""))
        for kind in ("requests", "tokens")
        if headers.get(f"x-ratelimit-remaining-{kind}") == "0"
    ]
    known = [w for w in waits if w is not None]
    return max(known) if known else None


def rate_limit_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The `x-ratelimit-*` headers of a response, lower-cased."""
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith("x-ratelimit-")}
