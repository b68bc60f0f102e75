"""Politeness: robots.txt rules and cache, the per-host pace and 429/503 pauses, the port
rule; then the same through HttpxFetcher against loopback sites (stub resolvers only)."""

from __future__ import annotations

import collections
import ipaddress
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.errors import BlockedURL, FetchTimeout, HTTPStatusError
from webctx.net.addresses import AddressPolicy
from webctx.net.politeness import (
    HostPacer,
    Politeness,
    RedisHostPacer,
    RobotsCache,
    parse_retry_after,
    robots_rules,
)
from webctx.net.portpolicy import check_port
from webctx.settings import FetchSettings

# Paces of a fraction of a second: these run alone (make test), not beside other tests.
pytestmark = pytest.mark.serial

UA = "webctx/0.1 (+https://example.invalid/bot)"
ROBOTS = """User-agent: otherbot
Disallow: /

User-agent: webctx
Disallow: /private
Crawl-delay: 2
"""
ARTICLE = "<html><body><p>" + "Battery ageing notes. " * 20 + "</p></body></html>"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_robots_rules_apply_to_our_agent_only() -> None:
    rules = robots_rules(200, ROBOTS.encode(), user_agent=UA)
    assert not rules.allows("http://a.test/private/x")
    assert rules.allows("http://a.test/public")
    assert rules.crawl_delay == 2.0


@pytest.mark.parametrize(("status", "allowed"), [(404, True), (410, True), (500, False),
                                                 (503, False), (429, False)])  # fmt: skip
def test_robots_status_decides_when_there_is_no_file(status: int, allowed: bool) -> None:
    assert robots_rules(status, b"", user_agent=UA).allows("http://a.test/page") is allowed


def test_robots_cache_expires_and_keeps_unreachable_briefly() -> None:
    clock = Clock()
    cache = RobotsCache(ttl_s=3600, clock=clock)
    cache.put("http://a.test", robots_rules(200, b"", user_agent=UA))
    cache.put("http://b.test", robots_rules(503, b"", user_agent=UA))
    clock.now += 301
    assert cache.get("http://a.test") is not None
    assert cache.get("http://b.test") is None  # an unreachable robots.txt is retried soon
    clock.now += 3600
    assert cache.get("http://a.test") is None


def test_pacer_spaces_request_starts_per_host() -> None:
    clock = Clock()
    pacer = HostPacer(delay_s=1.0, max_backoff_s=60, clock=clock)
    assert pacer.reserve("a.test", latest=clock.now + 10) == 0
    assert pacer.reserve("a.test", latest=clock.now + 10) == 1.0
    assert pacer.reserve("a.test", delay_s=3.0, latest=clock.now + 10) == 2.0
    assert pacer.reserve("b.test", latest=clock.now + 10) == 0  # other hosts unaffected
    assert pacer.reserve("a.test", latest=clock.now + 1) is None  # past the deadline: no slot


def test_pacer_pauses_a_busy_host_by_retry_after_else_doubling() -> None:
    clock = Clock()
    pacer = HostPacer(delay_s=0.0, max_backoff_s=30, clock=clock)
    assert pacer.busy("a.test", 7.0) == 7.0
    assert pacer.reserve("a.test", latest=clock.now + 100) == 7.0
    assert pacer.reserve("b.test", latest=clock.now + 100) == 0
    assert [pacer.busy("c.test", None) for _ in range(3)] == [1.0, 2.0, 4.0]
    pacer.ok("c.test")
    assert pacer.busy("c.test", None) == 1.0
    assert pacer.busy("d.test", 10_000) == 30  # capped


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_odd_ports_only_inside_explicitly_allowed_networks() -> None:
    public = [ipaddress.ip_address("93.184.216.34")]  # only checked, never connected to
    policy = AddressPolicy(allowed_networks=["10.1.0.0/16"])
    check_port("a.test", 443, public, policy=policy, allowed_ports={80, 443})
    with pytest.raises(BlockedURL, match="port 8080"):
        check_port("a.test", 8080, public, policy=policy, allowed_ports={80, 443})
    inside = [ipaddress.ip_address("10.1.2.3")]
    check_port("a.test", 6379, inside, policy=policy, allowed_ports={80, 443})
    private = [ipaddress.ip_address("192.168.1.5")]
    with pytest.raises(BlockedURL):
        check_port("a.test", 6379, private, policy=policy, allowed_ports={80, 443})
    lifted = AddressPolicy(allow_private=True)
    check_port("a.test", 6379, private, policy=lifted, allowed_ports={80, 443})
    with pytest.raises(BlockedURL):  # lifting the private guard does not open public odd ports
        check_port("a.test", 6379, public, policy=lifted, allowed_ports={80, 443})


# -- through the fetcher --------------------------------------------------------------------
SETTINGS = FetchSettings(connect_timeout_s=0.5, read_timeout_s=0.5, total_timeout_s=1.5,
                         max_bytes=200_000, per_host_delay_s=0.0, user_agent=UA)  # fmt: skip


@pytest.fixture
def site() -> Iterator[tuple[LoopbackServer, collections.Counter[str]]]:
    hits: collections.Counter[str] = collections.Counter()
    pages = {
        "/robots.txt": SitePage(ROBOTS, content_type="text/plain"),
        "/public": SitePage(ARTICLE),
        "/private/page": SitePage(ARTICLE),
        "/busy": SitePage("slow down", status=429, headers={"Retry-After": "30"}),
    }
    with LoopbackServer(make_site_app(pages, hits=hits)) as server:
        yield server, hits


def loopback(host: str, port: int) -> list[str]:
    return ["127.0.0.1"]  # every test name is served by the loopback site


def polite_fetcher(settings: FetchSettings = SETTINGS) -> HttpxFetcher:
    policy = AddressPolicy(allowed_networks=["127.0.0.1/32"])
    politeness = Politeness.from_settings(settings)
    return HttpxFetcher(settings, policy=policy, resolver=loopback, politeness=politeness)


def test_fetcher_honours_robots_and_fetches_it_once_per_origin(
    site: tuple[LoopbackServer, collections.Counter[str]],
) -> None:
    server, hits = site
    fetcher = polite_fetcher()
    fetcher.fetch(f"{server.url}/public")
    for _ in range(2):  # refused before its turn is even reserved: no Crawl-delay wait
        with pytest.raises(BlockedURL, match="robots.txt"):
            fetcher.fetch(f"{server.url}/private/page")
    assert hits["/private/page"] == 0
    assert hits["/robots.txt"] == 1
    assert hits["/public"] == 1


def test_origins_readied_ahead_are_asked_once_and_their_pages_fetched_without_asking(
    site: tuple[LoopbackServer, collections.Counter[str]],
) -> None:
    server, hits = site
    fetcher = polite_fetcher()
    try:
        # 127.0.0.2 is outside the policy: the guard refuses it, nothing is sent there.
        fetcher.warm_origins([f"{server.url}/public", f"{server.url}/private/page",
                              "http://127.0.0.2:9/x", "not a url"])  # fmt: skip
        asked = ("/robots.txt", "/.well-known/tdmrep.json")
        deadline = time.monotonic() + 10
        while sum(hits[p] for p in asked) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [hits[p] for p in asked] == [1, 1] and hits["/public"] == 0
        fetcher.fetch(f"{server.url}/public")
        with pytest.raises(BlockedURL, match="robots.txt"):
            fetcher.fetch(f"{server.url}/private/page")
        assert [hits[p] for p in asked] == [1, 1] and hits["/private/page"] == 0
    finally:
        fetcher.close()


def test_fetcher_applies_crawl_delay_between_requests(
    site: tuple[LoopbackServer, collections.Counter[str]],
) -> None:
    server, _ = site
    fetcher = polite_fetcher(SETTINGS.model_copy(update={"total_timeout_s": 5.0}))
    started = time.monotonic()
    fetcher.fetch(f"{server.url}/public")  # robots.txt first, then the page
    fetcher.fetch(f"{server.url}/public")  # starts 2 s after the first one started
    assert 1.95 <= time.monotonic() - started < 3.5  # Crawl-delay: 2


def test_429_pauses_that_host_only(site: tuple[LoopbackServer, collections.Counter[str]]) -> None:
    server, hits = site
    fetcher = polite_fetcher()
    port = server.port
    with pytest.raises(HTTPStatusError) as info:
        fetcher.fetch(f"http://busy.test:{port}/busy")
    assert info.value.status == 429
    started = time.monotonic()
    with pytest.raises(FetchTimeout, match="paused"):  # Retry-After 30 > the deadline: no wait
        fetcher.fetch(f"http://busy.test:{port}/public")
    assert time.monotonic() - started < 0.5
    assert hits["/public"] == 0
    assert fetcher.fetch(f"http://calm.test:{port}/public").status == 200


# -- shared through Redis (the machine's Redis: the pacer is Lua) ----------------------------
def shared_pacers(client: redis.Redis, n: int, *, delay_s: float = 0.5) -> list[RedisHostPacer]:
    """`n` pacers on one Redis: what `n` fetch worker processes hold."""
    return [RedisHostPacer(client, delay_s=delay_s, max_backoff_s=30) for _ in range(n)]


def test_processes_sharing_redis_share_one_pace_per_host(redis_client: redis.Redis) -> None:
    one, two = shared_pacers(redis_client, 2)
    later = time.monotonic() + 10
    assert one.reserve("a.test", latest=later) == 0
    first = time.monotonic()

    def waits(expected: float) -> object:
        """A wait of `expected` seconds after the first start, as seen now (Redis's clock
        moved on between the calls)."""
        return pytest.approx(expected - (time.monotonic() - first), abs=0.05)

    assert two.reserve("A.test", latest=later) == waits(0.5)  # same host
    assert one.reserve("a.test", latest=later) == waits(1.0)
    assert two.reserve("a.test", delay_s=3.0, latest=later) == waits(1.5)
    assert two.reserve("b.test", latest=later) == 0  # other hosts unaffected
    # A start past the deadline takes no slot: the next one is still 1.5 + 3 s away.
    assert one.reserve("a.test", latest=time.monotonic() + 1) is None
    assert one.reserve("a.test", latest=later) == waits(4.5)
    # The state expires once its pace has passed (plus a minute).
    ttl = redis_client.pttl("webctx:pace:a.test")
    assert 60_000 < ttl <= 66_000


def test_a_host_paused_by_one_process_is_paused_for_all(redis_client: redis.Redis) -> None:
    one, two = shared_pacers(redis_client, 2, delay_s=0.0)
    assert one.busy("a.test", 7.0) == 7.0
    assert two.reserve("a.test", latest=time.monotonic() + 100) == pytest.approx(7.0, abs=0.05)
    assert two.reserve("b.test", latest=time.monotonic() + 100) == 0
    # Without Retry-After the pause doubles, whichever process saw the 429.
    assert [one.busy("c.test", None), two.busy("c.test", None), one.busy("c.test", None)] == [
        1.0, 2.0, 4.0]  # fmt: skip
    two.ok("c.test")
    assert one.busy("c.test", None) == 1.0
    assert one.busy("d.test", 10_000) == 30  # capped
    two.ok("e.test")  # a host never seen: nothing is stored
    assert redis_client.exists("webctx:pace:e.test") == 0


def test_fetchers_of_two_processes_pace_one_host_together(
    site: tuple[LoopbackServer, collections.Counter[str]], redis_client: redis.Redis
) -> None:
    server, hits = site
    settings = SETTINGS.model_copy(update={"per_host_delay_s": 0.4, "total_timeout_s": 5.0,
                                           "respect_robots": False})  # fmt: skip
    policy = AddressPolicy(allowed_networks=["127.0.0.1/32"])
    fetchers = [
        HttpxFetcher(settings, policy=policy, resolver=loopback,
                     politeness=Politeness.from_settings(settings, shared=redis_client))
        for _ in range(2)
    ]  # fmt: skip
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda i: fetchers[i % 2].fetch(f"{server.url}/public"), range(4)))
    elapsed = time.monotonic() - started
    assert [d.status for d in done] == [200] * 4 and hits["/public"] == 4
    # Four starts 0.4 s apart, whichever fetcher made them: at least 1.2 s (each fetcher
    # pacing alone would have needed 0.4 s).
    assert 1.15 <= elapsed < 3.0


# -- robots.txt answers: redirects, unreachable, oversized ------------------------------------
def serve(pages: dict[str, SitePage]) -> tuple[LoopbackServer, collections.Counter[str]]:
    hits: collections.Counter[str] = collections.Counter()
    return LoopbackServer(make_site_app(pages, hits=hits)).start(), hits


def test_robots_redirects_are_followed_and_refusals_name_the_rule() -> None:
    server, hits = serve({
        "/robots.txt": SitePage(redirect_to="/moved", status=301),
        "/moved": SitePage(redirect_to="/rules.txt", status=302),
        "/rules.txt": SitePage("User-agent: *\nDisallow: /private\n", content_type="text/plain"),
        "/public": SitePage(ARTICLE),
    })  # fmt: skip
    try:
        fetcher = polite_fetcher()
        with pytest.raises(BlockedURL, match="line 2: Disallow: /private"):
            fetcher.fetch(f"{server.url}/private/page")
        assert fetcher.fetch(f"{server.url}/public").status == 200
        assert hits["/rules.txt"] == 1 and hits["/private/page"] == 0
    finally:
        server.stop()


def test_robots_past_five_redirects_means_no_rules() -> None:
    pages = {f"/r{i}": SitePage(redirect_to=f"/r{i + 1}") for i in range(10)}
    pages["/robots.txt"] = SitePage(redirect_to="/r0")
    pages["/public"] = SitePage(ARTICLE)
    server, hits = serve(pages)
    try:
        assert polite_fetcher().fetch(f"{server.url}/public").status == 200
        assert hits["/r4"] == 1 and hits["/r5"] == 0  # robots.txt + 5 redirects, then stop
    finally:
        server.stop()


def test_unreachable_robots_disallows_the_origin_for_a_while() -> None:
    server, _ = serve({})
    port = server.port
    server.stop()  # nothing listens there any more: the connection is refused
    politeness = Politeness.from_settings(SETTINGS)
    policy = AddressPolicy(allowed_networks=["127.0.0.1/32"])
    fetcher = HttpxFetcher(SETTINGS, policy=policy, resolver=loopback, politeness=politeness)
    with pytest.raises(BlockedURL, match="unreachable"):
        fetcher.fetch(f"http://127.0.0.1:{port}/page")
    cached = politeness.robots.get(f"http://127.0.0.1:{port}")
    assert cached is not None and cached.disallow_all  # kept (briefly): not asked per page


def test_oversized_robots_is_read_to_500_kib_not_refused() -> None:
    filler = "# " + "x" * 1000 + "\n"
    body = "User-agent: *\nDisallow: /early\n" + filler * 600 + "Disallow: /late\n"
    server, _ = serve({"/robots.txt": SitePage(body, content_type="text/plain"),
                       "/late": SitePage(ARTICLE)})  # fmt: skip
    try:
        fetcher = polite_fetcher()
        with pytest.raises(BlockedURL, match="/early"):
            fetcher.fetch(f"{server.url}/early")
        assert fetcher.fetch(f"{server.url}/late").status == 200  # past 500 KiB: unread
    finally:
        server.stop()


def test_fractional_crawl_delay_paces_requests() -> None:
    robots = "User-agent: webctx\nCrawl-delay: 0.5\n"
    server, _ = serve({"/robots.txt": SitePage(robots, content_type="text/plain"),
                       "/public": SitePage(ARTICLE)})  # fmt: skip
    try:
        fetcher = polite_fetcher(SETTINGS.model_copy(update={"total_timeout_s": 5.0}))
        started = time.monotonic()
        for _ in range(3):
            fetcher.fetch(f"{server.url}/public")
        assert 0.95 <= time.monotonic() - started < 2.5  # two gaps of 0.5 s
    finally:
        server.stop()
