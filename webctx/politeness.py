"""How the fetcher treats the sites it visits: robots.txt, a pace per host, and a pause
when a host answers 429 or 503.

State is per process: one `Politeness` per fetcher, shared by its threads. Each worker
process therefore paces a host on its own, so N fetch workers may together send up to N
requests per `per_host_delay_s` to one host (a Redis-shared pacer would make it one).
robots.txt follows RFC 9309: 2xx is parsed, 4xx allows everything, 5xx (and 429) means
"unreachable", hence disallow everything for a short while.
"""

from __future__ import annotations

import email.utils
import threading
import time
import urllib.robotparser
from collections.abc import Callable
from dataclasses import dataclass, field

from webctx.settings import FetchSettings

ROBOTS_MAX_BYTES = 512 * 1024  # RFC 9309: parse at least 500 KiB
UNREACHABLE_TTL_S = 300.0  # how long a 5xx robots.txt blocks its origin
MAX_CRAWL_DELAY_S = 60.0
Clock = Callable[[], float]


@dataclass(frozen=True)
class RobotsRules:
    """The robots.txt verdicts for one origin and one user agent."""

    parser: urllib.robotparser.RobotFileParser | None
    user_agent: str
    disallow_all: bool = False

    def allows(self, url: str) -> bool:
        """True if `url` may be fetched."""
        if self.disallow_all:
            return False
        return self.parser is None or self.parser.can_fetch(self.user_agent, url)

    @property
    def crawl_delay(self) -> float | None:
        """The Crawl-delay for our agent, capped, if the file sets one."""
        if self.parser is None:
            return None
        delay = self.parser.crawl_delay(self.user_agent)
        return min(float(delay), MAX_CRAWL_DELAY_S) if delay is not None else None


def robots_rules(status: int, body: bytes, *, user_agent: str) -> RobotsRules:
    """Rules from the answer to GET /robots.txt (status after redirects)."""
    if 200 <= status < 300:
        parser = urllib.robotparser.RobotFileParser()
        text = body[:ROBOTS_MAX_BYTES].decode("utf-8", errors="replace")
        parser.parse(text.splitlines())
        return RobotsRules(parser, user_agent)
    if status == 429 or status >= 500:
        return RobotsRules(None, user_agent, disallow_all=True)
    return RobotsRules(None, user_agent)  # 4xx (and odd 1xx/3xx): no rules, all allowed


class RobotsCache:
    """robots.txt rules per origin (scheme://host:port), each kept for `ttl_s`."""

    def __init__(self, *, ttl_s: float, clock: Clock = time.monotonic) -> None:
        self._ttl_s, self._clock = ttl_s, clock
        self._lock = threading.Lock()
        self._rules: dict[str, tuple[float, RobotsRules]] = {}

    def get(self, origin: str) -> RobotsRules | None:
        """Cached rules, or None when they must be fetched."""
        with self._lock:
            entry = self._rules.get(origin)
            if entry is None or entry[0] <= self._clock():
                return None
            return entry[1]

    def put(self, origin: str, rules: RobotsRules) -> None:
        """Remember `rules` (an unreachable robots.txt only briefly)."""
        ttl = min(self._ttl_s, UNREACHABLE_TTL_S) if rules.disallow_all else self._ttl_s
        with self._lock:
            self._rules[origin] = (self._clock() + ttl, rules)


@dataclass
class _HostState:
    next_start: float = 0.0
    busy_until: float = 0.0
    busy_count: int = 0


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


@dataclass
class Politeness:
    """What a polite fetcher consults before each request (robots.txt, pace, pauses)."""

    user_agent: str
    respect_robots: bool = True
    robots: RobotsCache = field(default_factory=lambda: RobotsCache(ttl_s=3600.0))
    pacer: HostPacer = field(default_factory=lambda: HostPacer(delay_s=1.0, max_backoff_s=300.0))

    @classmethod
    def from_settings(cls, settings: FetchSettings) -> Politeness:
        """The politeness `settings` describe."""
        return cls(
            user_agent=settings.user_agent,
            respect_robots=settings.respect_robots,
            robots=RobotsCache(ttl_s=settings.robots_ttl_s),
            pacer=HostPacer(
                delay_s=settings.per_host_delay_s, max_backoff_s=settings.max_backoff_s
            ),
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
