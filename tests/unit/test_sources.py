"""The source registry (intervals, add/list/remove, due claims) and source discovery."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import redis_url
from tests.fetch_site import LOOPBACK_ONLY, SETTINGS, no_dns
from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.errors import InvalidRequest, InvalidTenant
from webctx.index.refresh import RefreshReport
from webctx.index.sources import Source, SourceRegistry, discover_urls, parse_interval
from webctx.models import Download

BASE = "https://site.test"


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


class XmlSite:
    def __init__(self, docs: dict[str, str]) -> None:
        self.docs = docs
        self.fetched: list[str] = []

    def fetch(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        media_types: frozenset[str] | None = None,
    ) -> Download:
        self.fetched.append(url)
        return Download(url=url, final_url=url, status=200, content_type="application/xml",
                        body=self.docs[url].encode())  # fmt: skip


def source(url: str, kind: str = "auto") -> Source:
    return Source(source_id="s1", tenant="t", url=url, kind=kind, every_s=60,  # type: ignore[arg-type]
                  created_at=0.0)  # fmt: skip


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("15m", 900), ("6h", 21600),
                                               ("1d", 86400), ("2W", 1209600)])  # fmt: skip
def test_intervals_parse_with_units(text: str, seconds: int) -> None:
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["", "6 hours", "-1h", "0", "400d", "1e9"])
def test_bad_intervals_are_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_interval(text)


def test_sources_are_per_tenant_and_removable_by_id_or_url(r: redis.Redis) -> None:
    registry = SourceRegistry(r)
    a = registry.add("acme", BASE + "/feed.xml", every_s=3600)
    again = registry.add("acme", BASE + "/feed.xml", every_s=600)
    assert again.source_id == a.source_id and again.every_s == 600
    registry.add("other", BASE + "/feed.xml", every_s=600)
    assert [s.url for s in registry.list_for("acme")] == [BASE + "/feed.xml"]
    assert registry.remove("acme", BASE + "/feed.xml") is not None
    assert registry.list_for("acme") == [] and len(registry.list_for("other")) == 1
    assert registry.remove("acme", a.source_id) is None
    with pytest.raises(InvalidRequest):
        registry.add("acme", "file:///etc/passwd", every_s=600)
    with pytest.raises(InvalidTenant):
        registry.add("bad tenant", BASE, every_s=600)


def test_a_refresh_interval_below_five_minutes_is_refused(r: redis.Redis) -> None:
    registry = SourceRegistry(r)
    for every_s in (1, 299):
        with pytest.raises(InvalidRequest, match="below the minimum of 300 s"):
            registry.add("acme", BASE + "/a.html", every_s=every_s)
    assert registry.list_for("acme") == []
    assert registry.add("acme", BASE + "/b.html", every_s=300).every_s == 300
    # Below it only where a registry is given a lower floor (the schedule's own tests).
    assert SourceRegistry(r, min_every_s=1).add("acme", BASE + "/a.html", every_s=1).every_s == 1


def test_removed_source_is_never_claimed_again(r: redis.Redis) -> None:
    registry = SourceRegistry(r)
    s = registry.add("acme", BASE + "/a.html", every_s=600)
    registry.remove("acme", s.source_id)
    assert registry.claim_due(now=10**10) == []


def test_plain_page_is_its_own_only_url_without_a_fetch() -> None:
    site = XmlSite({})
    found = discover_urls(source(BASE + "/article.html"), site, max_pages=10)
    assert found.urls == [BASE + "/article.html"] and site.fetched == []


def test_sitemap_index_is_followed_and_complete_lists_allow_drops() -> None:
    ns = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
    site = XmlSite({
        BASE + "/sitemap.xml": f"<sitemapindex {ns}><sitemap><loc>{BASE}/s1.xml</loc></sitemap>"
                               f"<sitemap><loc>/s2.xml</loc></sitemap></sitemapindex>",
        BASE + "/s1.xml": f"<urlset {ns}><url><loc>{BASE}/a</loc></url></urlset>",
        BASE + "/s2.xml": f"<urlset {ns}><url><loc>{BASE}/b</loc></url>"
                          f"<url><loc>{BASE}/a</loc></url></urlset>",
    })  # fmt: skip
    found = discover_urls(source(BASE + "/sitemap.xml"), site, max_pages=10)
    assert found.urls == [BASE + "/a", BASE + "/b"] and found.complete
    capped = discover_urls(source(BASE + "/sitemap.xml"), site, max_pages=1)
    assert len(capped.urls) == 1 and not capped.complete


def test_rss_and_atom_feeds_give_their_item_links() -> None:
    rss = (f"<rss><channel><link>{BASE}</link><item><link>{BASE}/one</link></item>"
           f"<item><link>{BASE}/two</link></item></channel></rss>")  # fmt: skip
    atom = (
        '<feed xmlns="http://www.w3.org/2005/Atom"><entry>'
        f'<link rel="self" href="{BASE}/self"/><link href="{BASE}/three"/></entry></feed>'
    )
    site = XmlSite({BASE + "/rss.xml": rss, BASE + "/atom.xml": atom})
    assert discover_urls(source(BASE + "/rss.xml"), site, max_pages=10).urls == [
        BASE + "/one", BASE + "/two"]  # fmt: skip
    found = discover_urls(source(BASE + "/atom.xml", "feed"), site, max_pages=10)
    assert found.urls == [BASE + "/three"] and not found.complete


def test_xml_entities_are_not_expanded() -> None:
    bomb = (
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
        f"<urlset><url><loc>{BASE}/&b;</loc></url></urlset>"
    )
    site = XmlSite({BASE + "/sitemap.xml": bomb})
    found = discover_urls(source(BASE + "/sitemap.xml"), site, max_pages=10)
    assert all("aaaaaaaaaa" not in u for u in found.urls)


def test_a_forbidden_sitemap_index_entry_is_skipped_and_reported() -> None:
    """A real fetcher under the guard: 127.0.0.1 allowed, the entry on 127.0.0.2 refused."""
    ns = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
    xml = "application/xml"
    other_hits: collections.Counter[str] = collections.Counter()
    forbidden_map = SitePage(f"<urlset {ns}><url><loc>/secret</loc></url></urlset>",
                             content_type=xml)  # fmt: skip
    other = LoopbackServer(make_site_app({"/s.xml": forbidden_map}, hits=other_hits), "127.0.0.2")
    with other:
        pages = {
            "/sitemap.xml": SitePage(f"<sitemapindex {ns}><sitemap><loc>{other.url}/s.xml</loc>"
                                     "</sitemap><sitemap><loc>/s1.xml</loc></sitemap>"
                                     "</sitemapindex>", content_type=xml),
            "/s1.xml": SitePage(f"<urlset {ns}><url><loc>/a</loc></url></urlset>",
                                content_type=xml),
        }  # fmt: skip
        with LoopbackServer(make_site_app(pages)) as main:
            fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=no_dns)
            try:
                found = discover_urls(source(main.url + "/sitemap.xml"), fetcher, max_pages=10)
            finally:
                fetcher.close()
    assert found.urls == [main.url + "/a"]
    assert len(found.skipped) == 1 and found.skipped[0].startswith(f"{other.url}/s.xml: ")
    assert "127.0.0.2" in found.skipped[0]
    assert not found.complete  # the skipped sitemap's pages are not dropped from the index
    assert sum(other_hits.values()) == 0
    report = RefreshReport(source_id="s1", skipped=found.skipped).as_dict()
    assert report["skipped"] == 1 and "127.0.0.2" in str(report["skipped_entries"])
