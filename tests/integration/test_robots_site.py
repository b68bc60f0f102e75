"""robots.txt end to end: a loopback site whose robots.txt uses `*`, `$` and a longer
Allow inside a Disallow, fetched by the real fetcher from many threads at once."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.errors import BlockedURL, FetchError
from webctx.net.addresses import AddressPolicy
from webctx.net.politeness import Politeness
from webctx.settings import FetchSettings

UA = "webctx/0.1 (+https://example.invalid/bot)"
ROBOTS = """# Each rule below is one the standard library's parser got wrong.
User-agent: web
Disallow: /

User-agent: WebCtx/2
Disallow: /shop/
Allow: /shop/public/

Disallow: /*.pdf$

User-agent: *
Disallow: /about

User-agent: webctx
Disallow: /drafts/
"""
ARTICLE = "<html><body><p>" + "Battery ageing notes. " * 20 + "</p></body></html>"
# path -> the rule that refuses it to webctx (None: fetched)
EXPECTED: dict[str, str | None] = {
    "/shop/public/item": None,  # the longer Allow wins over the earlier Disallow
    "/shop/cart": "line 6: Disallow: /shop/",
    "/shop": None,
    "/docs/manual.pdf": "line 9: Disallow: /*.pdf$",  # after a blank line, same group
    "/docs/manual.pdf.html": None,  # `$`: the path must end there
    "/drafts/plan": "line 15: Disallow: /drafts/",  # a second group for webctx, merged
    "/about": None,  # webctx is named: the * group does not apply, nor `web`'s
}


@pytest.fixture
def site() -> Iterator[tuple[LoopbackServer, collections.Counter[str]]]:
    hits: collections.Counter[str] = collections.Counter()
    pages = {path: SitePage(ARTICLE) for path in EXPECTED}
    # A slow robots.txt: every fetch below starts while its request is still under way.
    pages["/robots.txt"] = SitePage(ROBOTS, content_type="text/plain", delay_s=0.5)
    with LoopbackServer(make_site_app(pages, hits=hits)) as server:
        yield server, hits


def fetch_all(server: LoopbackServer, paths: list[str], agent: str) -> dict[str, str | None]:
    settings = FetchSettings(total_timeout_s=5.0, per_host_delay_s=0.0, user_agent=agent,
                             product_token=agent.split("/")[0],
                             per_host_concurrency=8, concurrency=16)  # fmt: skip
    fetcher = HttpxFetcher(settings, policy=AddressPolicy(allowed_networks=["127.0.0.1/32"]),
                           politeness=Politeness.from_settings(settings))  # fmt: skip

    def outcome(path: str) -> str | None:
        try:
            fetcher.fetch(server.url + path)
        except BlockedURL as exc:
            return str(exc)
        except FetchError as exc:  # any other failure is a test failure, with its reason
            return f"unexpected: {exc!r}"
        return None

    with ThreadPoolExecutor(len(paths)) as pool:
        return dict(zip(paths, pool.map(outcome, paths), strict=True))


def test_concurrent_fetches_share_one_robots_request_and_follow_rfc_9309(
    site: tuple[LoopbackServer, collections.Counter[str]],
) -> None:
    server, hits = site
    paths = [p for p in EXPECTED for _ in range(2)]  # 14 fetches, 7 pages, one origin
    got = fetch_all(server, paths, UA)
    for path, rule in EXPECTED.items():
        if rule is None:
            assert got[path] is None, f"{path} refused: {got[path]}"
        else:
            assert got[path] is not None and rule in got[path], f"{path}: {got[path]}"
            assert hits[path] == 0  # refused before any request
    assert hits["/robots.txt"] == 1
    assert hits["/.well-known/tdmrep.json"] == 1  # read alongside, shared the same way


def test_the_star_group_binds_an_agent_no_group_names(
    site: tuple[LoopbackServer, collections.Counter[str]],
) -> None:
    server, hits = site
    got = fetch_all(server, ["/about", "/shop/cart", "/docs/manual.pdf"], "otherbot/1.0")
    assert "line 12: Disallow: /about" in (got["/about"] or ""), got["/about"]
    assert got["/shop/cart"] is None, got["/shop/cart"]
    assert got["/docs/manual.pdf"] is None, got["/docs/manual.pdf"]
    assert hits["/robots.txt"] == 1
