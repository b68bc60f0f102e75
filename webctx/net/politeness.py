"""How the fetcher treats the sites it visits: robots.txt, a pace per host, and a pause
when a host answers 429 or 503.

The pace and the pauses are kept per host either in the process (`HostPacer`, the
embedded default: one process) or in Redis (`RedisHostPacer`, broker mode), where every
fetch worker shares them: N workers together still start one request per
`per_host_delay_s` to a host, and a 429 pauses the host for all of them. robots.txt rules
are cached per process (they are read, not sent).

robots.txt follows RFC 9309 (`webctx.net.robots` decides): 2xx is parsed, 4xx allows
everything, 5xx (and 429) or no answer at all means "unreachable", hence disallow
everything for a short while.
"""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import redis

from webctx.net.optouts import TdmRep
from webctx.net.robots import MAX_PARSE_BYTES, Decision, RobotsFile, parse_robots, product_token
from webctx.settings import FetchSettings

ROBOTS_MAX_BYTES = MAX_PARSE_BYTES  # RFC 9309: parse at least 500 KiB
UNREACHABLE_TTL_S = 300.0  # how long a 5xx or unreachable robots.txt blocks its origin
MAX_CRAWL_DELAY_S = 60.0
Clock = Callable[[], float]
T = TypeVar("T")
_UNREACHABLE = Decision(False, "unreachable (5xx, 429 or no answer), so all disallowed for now")


@dataclass(frozen=True)
class RobotsRules:
    """The robots.txt verdicts for one origin and one user agent."""

    robots: RobotsFile | None
    user_agent: str
    disallow_all: bool = False

    def decide(self, url: str) -> Decision:
        """The verdict on `url`, with the rule that gave it."""
        if self.disallow_all:
            return _UNREACHABLE
        return self.robots.decide(url, self.user_agent) if self.robots else Decision(True)

    def allows(self, url: str) -> bool:
        """True if `url` may be fetched."""
        return self.decide(url).allowed

    @property
    def crawl_delay(self) -> float | None:
        """The Crawl-delay for our agent (fractions too), capped, if the file sets one."""
        if self.robots is None:
            return None
        delay = self.robots.crawl_delay(self.user_agent)
        return min(delay, MAX_CRAWL_DELAY_S) if delay is not None else None


def robots_rules(status: int, body: bytes, *, user_agent: str) -> RobotsRules:
    """Rules from the answer to GET /robots.txt (status after redirects)."""
    if 200 <= status < 300:
        return RobotsRules(parse_robots(body), user_agent)
    if status == 429 or status >= 500:
        return unreachable_rules(user_agent)
    return RobotsRules(None, user_agent)  # 4xx (and odd 1xx/3xx): no rules, all allowed


def unreachable_rules(user_agent: str) -> RobotsRules:
    """A robots.txt that could not be read (5xx, 429, no connection): disallow all."""
    return RobotsRules(None, user_agent, disallow_all=True)


class OriginCache(Generic[T]):
    """An answer per origin (scheme://host:port), each kept for `ttl_s`."""

    def __init__(self, *, ttl_s: float, clock: Clock = time.monotonic) -> None:
        self._ttl_s, self._clock = ttl_s, clock
        self._lock = threading.Lock()
        self._rules: dict[str, tuple[float, T]] = {}

    def get(self, origin: str) -> T | None:
        """The cached answer, or None when it must be fetched."""
        with self._lock:
            entry = self._rules.get(origin)
            if entry is None or entry[0] <= self._clock():
                return None
            return entry[1]

    def put(self, origin: str, rules: T, *, brief: bool = False) -> None:
        """Remember `rules`; a `brief` answer (the file could not be read) only for
        `UNREACHABLE_TTL_S`."""
        ttl = min(self._ttl_s, UNREACHABLE_TTL_S) if brief else self._ttl_s
        with self._lock:
            self._rules[origin] = (self._clock() + ttl, rules)


class RobotsCache(OriginCache[RobotsRules]):
    """robots.txt rules per origin, each kept for `ttl_s` (an unreachable one briefly)."""

    def put(self, origin: str, rules: RobotsRules, *, brief: bool = False) -> None:
        """Remember `rules` (an unreachable robots.txt only briefly)."""
        super().put(origin, rules, brief=brief or rules.disallow_all)


@dataclass
class _HostState:
    next_start: float = 0.0
    busy_until: float = 0.0
    busy_count: int = 0


class Pacer(Protocol):
    """Spaces request starts to each host and pauses a host that said 429/503."""

    def reserve(
        self, host: str, *, delay_s: float | None = None, latest: float
    ) -> float | None: ...
    def busy(self, host: str, retry_after: float | None) -> float: ...
    def ok(self, host: str) -> None: ...


class HostPacer:
    """Spaces request starts to each host and pauses a host that said 429/503."""

    def __init__(
        self, *, delay_s: float, max_backoff_s: float, clock: Clock = time.monotonic
    ) -> None:
        self._delay_s, self._max_backoff_s, self._clock = delay_s, max_backoff_s, clock
        self._lock = threading.Lock()
        self._hosts: dict[str, _HostState] = {}

    def reserve(self, host: str, *, delay_s: float | None = None, latest: float) -> float | None:
        """Seconds to wait before starting a request to `host`, the slot being taken;
        None (nothing taken) if that start would fall after `latest` (a clock time)."""
        delay = max(self._delay_s, delay_s or 0.0)
        with self._lock:
            state = self._hosts.setdefault(host, _HostState())
            now = self._clock()
            start = max(now, state.next_start, state.busy_until)
            if start > latest:
                return None
            state.next_start = start + delay
            return start - now

    def busy(self, host: str, retry_after: float | None) -> float:
        """`host` answered 429/503: pause it (Retry-After, else doubling); returns the pause."""
        with self._lock:
            state = self._hosts.setdefault(host, _HostState())
            state.busy_count += 1
            fallback = max(self._delay_s, 1.0) * 2 ** (state.busy_count - 1)
            pause = min(retry_after if retry_after is not None else fallback, self._max_backoff_s)
            state.busy_until = max(state.busy_until, self._clock() + pause)
            return pause

    def ok(self, host: str) -> None:
        """`host` answered normally: the next 429 starts the doubling afresh."""
        with self._lock:
            state = self._hosts.get(host)
            if state is not None:
                state.busy_count = 0


_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
# The keys outlive the pace and pause they hold by this much (ms), then expire.
_KEEP_MS = 60_000

# KEYS: host. ARGV: delay_ms, max_wait_ms, keep_ms. -> wait_ms, or -1 (too late: nothing
# taken)
_RESERVE = (
    _NOW_MS
    + """
local nxt = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
local busy = tonumber(redis.call('HGET', KEYS[1], 'busy_until') or '0')
local start = math.max(now, nxt, busy)
if start - now > tonumber(ARGV[2]) then return -1 end
redis.call('HSET', KEYS[1], 'next', start + tonumber(ARGV[1]))
redis.call('PEXPIREAT', KEYS[1], math.max(start + tonumber(ARGV[1]), busy) + tonumber(ARGV[3]))
return start - now
"""
)

# KEYS: host. ARGV: base_ms (the doubling's first pause), retry_after_ms (-1: none),
# max_ms, keep_ms. -> the pause (ms)
_BUSY = (
    _NOW_MS
    + """
local count = redis.call('HINCRBY', KEYS[1], 'busy_count', 1)
local pause = tonumber(ARGV[2])
if pause < 0 then pause = tonumber(ARGV[1]) * 2 ^ math.min(count - 1, 30) end
pause = math.floor(math.min(pause, tonumber(ARGV[3])))
local busy = math.max(tonumber(redis.call('HGET', KEYS[1], 'busy_until') or '0'), now + pause)
local nxt = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
redis.call('HSET', KEYS[1], 'busy_until', busy)
redis.call('PEXPIREAT', KEYS[1], math.max(busy, nxt) + tonumber(ARGV[4]))
return pause
"""
)

_OK = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'busy_count', 0) end
"""


class RedisHostPacer:
    """`HostPacer` with its state in Redis, shared by every process that fetches: one
    pace and one 429/503 pause per host for all of them (Redis's clock, Lua scripts)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        delay_s: float,
        max_backoff_s: float,
        clock: Clock = time.monotonic,
        prefix: str = "webctx:pace",
    ) -> None:
        self._delay_s, self._max_backoff_s, self._clock = delay_s, max_backoff_s, clock
        self._prefix = prefix
        self._reserve = client.register_script(_RESERVE)
        self._busy = client.register_script(_BUSY)
        self._ok = client.register_script(_OK)

    def _key(self, host: str) -> str:
        return f"{self._prefix}:{host.lower()}"

    def reserve(self, host: str, *, delay_s: float | None = None, latest: float) -> float | None:
        """Seconds to wait before starting a request to `host`, the slot being taken;
        None (nothing taken) if that start would fall after `latest` (a clock time)."""
        delay_ms = _ms(max(self._delay_s, delay_s or 0.0))
        max_wait_ms = _ms(max(0.0, latest - self._clock()))
        args = [delay_ms, max_wait_ms, _KEEP_MS]
        wait_ms = int(self._reserve(keys=[self._key(host)], args=args))
        return None if wait_ms < 0 else wait_ms / 1000

    def busy(self, host: str, retry_after: float | None) -> float:
        """`host` answered 429/503: pause it for every process (Retry-After, else
        doubling); returns the pause."""
        base_ms = _ms(max(self._delay_s, 1.0))
        after_ms = -1 if retry_after is None else _ms(retry_after)
        args = [base_ms, after_ms, _ms(self._max_backoff_s), _KEEP_MS]
        return int(self._busy(keys=[self._key(host)], args=args)) / 1000

    def ok(self, host: str) -> None:
        """`host` answered normally: the next 429 starts the doubling afresh."""
        self._ok(keys=[self._key(host)])


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


@dataclass
class Politeness:
    """What a polite fetcher consults before each request (robots.txt, pace, pauses),
    and the origins' tdmrep.json it reads along."""

    user_agent: str
    respect_robots: bool = True
    robots: RobotsCache = field(default_factory=lambda: RobotsCache(ttl_s=3600.0))
    product_token: str = ""
    """The name robots.txt groups are matched against; "" : the User-Agent's first one."""
    tdmrep: OriginCache[TdmRep] = field(default_factory=lambda: OriginCache(ttl_s=3600.0))
    pacer: Pacer = field(default_factory=lambda: HostPacer(delay_s=1.0, max_backoff_s=300.0))

    @property
    def agent(self) -> str:
        """The product token robots.txt rules are matched against."""
        return self.product_token or product_token(self.user_agent)

    @classmethod
    def from_settings(
        cls, settings: FetchSettings, *, shared: redis.Redis | None = None
    ) -> Politeness:
        """The politeness `settings` describe; paced through Redis when `shared` is a
        client of the Redis every fetch worker uses."""
        delay, backoff = settings.per_host_delay_s, settings.max_backoff_s
        pacer: Pacer = (
            RedisHostPacer(shared, delay_s=delay, max_backoff_s=backoff)
            if shared is not None
            else HostPacer(delay_s=delay, max_backoff_s=backoff)
        )
        return cls(
            user_agent=settings.user_agent,
            respect_robots=settings.respect_robots,
            robots=RobotsCache(ttl_s=settings.robots_ttl_s),
            pacer=pacer,
            product_token=settings.product_token,
            tdmrep=OriginCache(ttl_s=settings.robots_ttl_s),
        )


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date), if it has one."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    wall = time.time() if now is None else now
    return max(0.0, when.timestamp() - wall)
