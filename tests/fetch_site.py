"""A hostile loopback site for the fetcher's tests, and their shared settings.

Only 127.0.0.1 and 127.0.0.2 are ever targeted, and every resolver is a stub, so no
packet leaves loopback even if the guard were broken.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.devweb.pdfgen import make_pdf, paginate
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, gzip_bomb_page, huge_page, make_site_app
from webctx.errors import FetchError
from webctx.net.addresses import AddressPolicy
from webctx.settings import FetchSettings

SETTINGS = FetchSettings(
    connect_timeout_s=0.5,
    read_timeout_s=0.5,
    total_timeout_s=5.0,
    max_bytes=200_000,
    max_redirects=3,
    per_host_concurrency=2,
    product_token="webctx-test",
    user_agent="webctx-test/1.0 (+https://example.invalid/bot)",
)
"""A deadline far above a loopback fetch, even on a loaded machine; the deadline tests
(test_fetch_deadlines.py) set their own."""
LOOPBACK_ONLY = AddressPolicy(allowed_networks=["127.0.0.1/32"])


MARGIN_S = 0.5


ARTICLE = """<!doctype html><html lang="en"><head>
<title>Why lithium plating happens | Battery Notes</title>
<meta property="og:site_name" content="Battery Notes">
<meta name="author" content="Ada Volta">
<meta property="article:published_time" content="2024-03-05T10:00:00Z">
</head><body>
<nav><a href="/">Home</a> <a href="/about">About us</a> <a href="/shop">Shop batteries</a></nav>
<div class="ad banner">Subscribe now for 50% off premium chargers!</div>
<article><h1>Why lithium plating happens</h1>
<p>Lithium plating occurs when lithium ions deposit as metal on the anode surface instead of
intercalating into the graphite, most often while fast charging at low temperatures.</p>
<p>Plated lithium reacts with the electrolyte, thickens the solid electrolyte interphase and
permanently removes cyclable lithium, which shows up as capacity fade over many cycles.</p>
<p>Charging protocols that reduce current below ten degrees Celsius limit plating and extend
cell life considerably, according to several long-term cycling studies.</p>
</article>
<footer>Copyright 2024 Battery Notes Ltd. All rights reserved. Privacy policy.</footer>
</body></html>"""


PARAGRAPH = "<p>" + "Solid electrolyte interphase growth consumes lithium. " * 6 + "</p>"


REPORT_LINES = [
    "Lithium plating occurs when lithium ions deposit as metal on the anode.",
    "Plated lithium thickens the solid electrolyte interphase over many cycles.",
]
REPORT_PDF = make_pdf(
    [REPORT_LINES, ["Charging below ten degrees Celsius limits plating."]],
    title="Lithium plating",
    author="Ada Volta",
    created="D:20240305",
)
# Over SETTINGS.max_bytes, under its pdf_max_bytes: uncompressed, 60 pages.
BIG_PDF = make_pdf(paginate(["Solid electrolyte interphase growth consumes lithium. " * 6] * 600),
                   compress=False)  # fmt: skip


INTERSTITIAL = """<html><head><title>Just a moment...</title></head><body>
<h1>Checking your browser before accessing the site.</h1>
<p>Please enable JavaScript and cookies to continue.</p>
<div class="cf-challenge" id="challenge-platform"></div></body></html>"""


@dataclass
class Site:
    """The main site on 127.0.0.1 and a forbidden one on 127.0.0.2, with counters."""

    main: LoopbackServer
    other: LoopbackServer
    hits: collections.Counter[str]
    sent: collections.Counter[str]
    other_hits: collections.Counter[str]
    requests: list[dict[str, str]]

    def url(self, path: str) -> str:
        return self.main.url + path


def recording(app: ASGIApp, requests: list[dict[str, str]]) -> ASGIApp:
    """Wrap `app` to record each request's headers."""

    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            requests.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    return wrapper


def serve_site() -> Iterator[Site]:
    """The main site (every page of `site_pages`) and the forbidden one, while iterated."""
    other_hits: collections.Counter[str] = collections.Counter()
    other = LoopbackServer(make_site_app({"/": SitePage(ARTICLE)}, hits=other_hits), "127.0.0.2")
    hits: collections.Counter[str] = collections.Counter()
    sent: collections.Counter[str] = collections.Counter()
    requests: list[dict[str, str]] = []
    with other:
        pages = site_pages(other.url)
        app = recording(make_site_app(pages, hits=hits, sent=sent), requests)
        with LoopbackServer(app) as main:
            yield Site(main, other, hits, sent, other_hits, requests)


def site_pages(other_url: str) -> dict[str, SitePage]:
    other_port = other_url.rsplit(":", 1)[1]
    cached = {"ETag": '"v1"', "Last-Modified": "Tue, 05 Mar 2024 10:00:00 GMT"}
    bad_utf8 = b"<html><body><p>Caf\xc3\xa9 \xff\xfe\xc3 broken bytes.</p>" + PARAGRAPH.encode()
    cp1252 = b'<html><head><meta charset="windows-1252"></head><body><p>Caf\xe9 \x93quoted\x94.</p>'
    return {
        "/article": SitePage(ARTICLE, headers=cached),
        "/error": SitePage("oops", status=500),
        "/slow": SitePage(ARTICLE, delay_s=5.0),
        "/trickle": SitePage(ARTICLE * 20, trickle_s=0.02),
        "/huge": huge_page(1_000_000_000),
        "/huge-chunked": huge_page(1_000_000_000, content_length=False),
        "/bomb": gzip_bomb_page(50_000_000),
        "/pdf": SitePage(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", content_type="application/pdf"),
        "/not-a-pdf": SitePage(ARTICLE, content_type="application/pdf"),
        "/files/report.pdf": SitePage(REPORT_PDF, content_type="application/octet-stream"),
        "/big.pdf": SitePage(BIG_PDF, content_type="application/pdf"),
        "/png": SitePage(b"\x89PNG\r\n\x1a\n" + bytes(200), content_type="image/png"),
        "/binary-as-html": SitePage(bytes(range(256)) * 8),
        "/bad-utf8": SitePage(bad_utf8 + b"</body></html>"),
        "/bogus-charset": SitePage(
            f"<html><body>{PARAGRAPH}</body></html>", content_type="text/html; charset=utf-foo"
        ),
        "/meta-cp1252": SitePage(cp1252 + PARAGRAPH.encode(), content_type="text/html"),
        "/plain": SitePage("Plain notes on battery ageing.\n" * 10, content_type="text/plain"),
        "/captcha": SitePage(INTERSTITIAL),
        "/empty": SitePage("<html><body><nav><a href='/'>Home</a></nav></body></html>"),
        "/loop": SitePage(redirect_to="/loop"),
        "/hop": SitePage(redirect_to="/article", status=301),
        "/to-other": SitePage(redirect_to=f"{other_url}/"),
        "/to-other-decimal": SitePage(redirect_to=f"http://2130706434:{other_port}/"),
        "/to-ftp": SitePage(redirect_to="ftp://127.0.0.1/file"),
        "/to-data": SitePage(redirect_to="data:text/html,<script>alert(1)</script>"),
    }


def no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"unexpected DNS lookup of {host}")


def loopback_fetcher() -> Iterator[HttpxFetcher]:
    """A fetcher allowed on 127.0.0.1 only, with no DNS."""
    fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=no_dns)
    yield fetcher
    fetcher.close()


def timed_failure(fetcher: HttpxFetcher, url: str) -> tuple[FetchError, float]:
    started = time.monotonic()
    with pytest.raises(FetchError) as info:
        fetcher.fetch(url)
    return info.value, time.monotonic() - started
