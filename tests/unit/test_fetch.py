"""The fetch stage against a hostile loopback site.

Only 127.0.0.1 and 127.0.0.2 are ever targeted, and every resolver is a stub, so no
packet leaves loopback even if the guard were broken.
"""

from __future__ import annotations

import collections
import hashlib
import html as html_module
import re
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import trafilatura
from starlette.types import ASGIApp, Receive, Scope, Send

from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, gzip_bomb_page, huge_page, make_site_app
from webctx.errors import (
    BlockedURL,
    ContentTooLarge,
    ExtractionError,
    FetchError,
    FetchTimeout,
    HTTPStatusError,
    UnsupportedContent,
)
from webctx.models import Download
from webctx.netguard import AddressPolicy
from webctx.ports import BatchFetcher, Revalidation
from webctx.settings import FetchSettings
from webctx.stages.fetch import detect_interstitial, extract_page, fetch_page

SETTINGS = FetchSettings(
    connect_timeout_s=0.5,
    read_timeout_s=0.5,
    total_timeout_s=0.8,
    max_bytes=200_000,
    max_redirects=3,
    per_host_concurrency=2,
    user_agent="webctx-test/1.0 (+https://example.invalid/bot)",
)
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


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
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
    }


def no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"unexpected DNS lookup of {host}")


@pytest.fixture(scope="module")
def fetcher() -> Iterator[HttpxFetcher]:
    fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=no_dns)
    yield fetcher
    fetcher.close()


def timed_failure(fetcher: HttpxFetcher, url: str) -> tuple[FetchError, float]:
    started = time.monotonic()
    with pytest.raises(FetchError) as info:
        fetcher.fetch(url)
    return info.value, time.monotonic() - started


def test_fetch_extracts_main_text_without_boilerplate(site: Site, fetcher: HttpxFetcher) -> None:
    page = fetch_page(site.url("/article"), fetcher, extract_timeout_s=5.0)
    assert "Lithium plating occurs when lithium ions deposit" in page.text
    assert "extend\ncell life" in page.text or "extend cell life" in page.text
    for boilerplate in ("Subscribe now", "About us", "Shop batteries", "Copyright", "Privacy"):
        assert boilerplate not in page.text
    assert page.title.startswith("Why lithium plating happens")
    assert (page.site, page.author, page.published) == ("Battery Notes", "Ada Volta", "2024-03-05")
    assert page.content_sha256 == hashlib.sha256(page.text.encode()).hexdigest()
    assert (page.etag, page.last_modified) == ('"v1"', "Tue, 05 Mar 2024 10:00:00 GMT")


def test_fetch_sends_user_agent_and_keeps_the_name_as_host(site: Site) -> None:
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"]

    fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=resolve)
    download = fetcher.fetch(f"http://docs.example.test:{site.main.port}/article")
    assert download.status == 200 and b"lithium plating" in download.body
    assert calls == ["docs.example.test"]  # one lookup: the address checked is the one used
    last = site.requests[-1]
    assert last["host"] == f"docs.example.test:{site.main.port}"
    assert last["user-agent"] == SETTINGS.user_agent


@pytest.mark.parametrize(("path", "status"), [("/missing", 404), ("/error", 500)])
def test_fetch_reports_http_error_status(
    site: Site, fetcher: HttpxFetcher, path: str, status: int
) -> None:
    with pytest.raises(HTTPStatusError) as info:
        fetcher.fetch(site.url(path))
    assert info.value.status == status
    assert info.value.url == site.url(path)


def test_fetch_gives_up_on_slow_page_at_total_deadline(site: Site) -> None:
    patient_settings = SETTINGS.model_copy(update={"read_timeout_s": 10.0})
    patient = HttpxFetcher(patient_settings, policy=LOOPBACK_ONLY, resolver=no_dns)
    error, elapsed = timed_failure(patient, site.url("/slow"))
    assert isinstance(error, FetchTimeout)
    assert SETTINGS.total_timeout_s - 0.05 <= elapsed < SETTINGS.total_timeout_s + MARGIN_S


def test_fetch_cuts_off_trickling_server_at_total_deadline(
    site: Site, fetcher: HttpxFetcher
) -> None:
    error, elapsed = timed_failure(fetcher, site.url("/trickle"))
    assert isinstance(error, FetchTimeout)  # each 8-byte read is far inside read_timeout_s
    assert elapsed < SETTINGS.total_timeout_s + MARGIN_S
    assert site.sent["/trickle"] < len(ARTICLE)


def test_fetch_refuses_huge_declared_length_before_reading(
    site: Site, fetcher: HttpxFetcher
) -> None:
    error, elapsed = timed_failure(fetcher, site.url("/huge"))
    assert isinstance(error, ContentTooLarge) and "Content-Length" in str(error)
    assert elapsed < 0.5
    time.sleep(0.1)  # let the server notice the disconnect
    assert site.sent["/huge"] < 20_000_000  # at most socket buffers, not the gigabyte


def test_fetch_caps_streamed_body_without_length(site: Site, fetcher: HttpxFetcher) -> None:
    error, _ = timed_failure(fetcher, site.url("/huge-chunked"))
    assert isinstance(error, ContentTooLarge)
    time.sleep(0.1)
    assert site.sent["/huge-chunked"] < 20_000_000


def test_fetch_caps_gzip_bomb_at_max_bytes(site: Site, fetcher: HttpxFetcher) -> None:
    tracemalloc.start()
    try:
        error, _ = timed_failure(fetcher, site.url("/bomb"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(error, ContentTooLarge)
    assert peak < 10 * SETTINGS.max_bytes  # the 50 MB inflation never happened


@pytest.mark.parametrize("path", ["/pdf", "/png", "/binary-as-html"])
def test_fetch_refuses_non_html_content(site: Site, fetcher: HttpxFetcher, path: str) -> None:
    with pytest.raises(UnsupportedContent):
        fetcher.fetch(site.url(path))


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/bad-utf8", "Café \ufffd"),
        ("/bogus-charset", "interphase"),
        ("/meta-cp1252", "Café “quoted”"),
    ],
)
def test_fetch_decodes_broken_or_odd_encodings_without_crashing(
    site: Site, fetcher: HttpxFetcher, path: str, expected: str
) -> None:
    page = fetch_page(site.url(path), fetcher, extract_timeout_s=5.0)
    assert expected in page.text


def test_fetch_passes_plain_text_through(site: Site, fetcher: HttpxFetcher) -> None:
    page = fetch_page(site.url("/plain"), fetcher, extract_timeout_s=5.0)
    assert page.text.startswith("Plain notes on battery ageing.")
    assert page.site == "127.0.0.1"


def test_fetch_follows_redirect_to_allowed_page(site: Site, fetcher: HttpxFetcher) -> None:
    download = fetcher.fetch(site.url("/hop"))
    assert (download.url, download.final_url) == (site.url("/hop"), site.url("/article"))


def test_fetch_caps_redirect_loop(site: Site, fetcher: HttpxFetcher) -> None:
    before = site.hits["/loop"]
    error, _ = timed_failure(fetcher, site.url("/loop"))
    assert type(error) is FetchError and "redirects" in str(error)
    assert site.hits["/loop"] - before == SETTINGS.max_redirects + 1


@pytest.mark.parametrize("path", ["/to-other", "/to-other-decimal", "/to-ftp"])
def test_fetch_refuses_redirect_to_disallowed_target(
    site: Site, fetcher: HttpxFetcher, path: str
) -> None:
    with pytest.raises(BlockedURL) as info:
        fetcher.fetch(site.url(path))
    assert info.value.url == site.url(path)
    assert sum(site.other_hits.values()) == 0


def test_fetch_refuses_private_address(site: Site) -> None:
    before = sum(site.hits.values())
    default = HttpxFetcher(SETTINGS, policy=AddressPolicy(), resolver=no_dns)
    for url in (site.url("/article"), f"http://2130706433:{site.main.port}/article"):
        with pytest.raises(BlockedURL):
            default.fetch(url)
    assert sum(site.hits.values()) == before


@pytest.mark.parametrize(
    "url", ["http://user:secret@127.0.0.1:{port}/article", "ftp://127.0.0.1:{port}/article"]
)
def test_fetch_refuses_userinfo_and_non_http_schemes(
    site: Site, fetcher: HttpxFetcher, url: str
) -> None:
    before = sum(site.hits.values())
    with pytest.raises(BlockedURL):
        fetcher.fetch(url.format(port=site.main.port))
    assert sum(site.hits.values()) == before


def test_fetch_refuses_name_resolving_to_disallowed_address(site: Site) -> None:
    def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.2"]

    fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=resolve)
    with pytest.raises(BlockedURL, match="127.0.0.2"):
        fetcher.fetch(f"http://rebind.example.test:{site.other.port}/")
    assert sum(site.other_hits.values()) == 0


def test_fetch_gives_up_on_hanging_dns_at_deadline(site: Site) -> None:
    release = threading.Event()

    def hanging(host: str, port: int) -> list[str]:
        release.wait(5.0)
        return ["127.0.0.1"]

    slow_connect = SETTINGS.model_copy(update={"connect_timeout_s": 5.0})
    fetcher = HttpxFetcher(slow_connect, policy=LOOPBACK_ONLY, resolver=hanging)
    try:
        error, elapsed = timed_failure(fetcher, f"http://hang.example.test:{site.main.port}/")
    finally:
        release.set()
        fetcher.close()
    assert isinstance(error, FetchTimeout)
    assert elapsed < SETTINGS.total_timeout_s + MARGIN_S


def test_fetch_reports_refused_connection_as_fetch_error(fetcher: HttpxFetcher) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    error, _ = timed_failure(fetcher, f"http://127.0.0.1:{port}/")
    assert type(error) is FetchError and "ConnectError" in str(error)


def test_fetch_limits_concurrency_per_host(site: Site) -> None:
    settings = SETTINGS.model_copy(
        update={"per_host_concurrency": 1, "read_timeout_s": 5.0, "total_timeout_s": 5.0}
    )
    serial = HttpxFetcher(settings, policy=LOOPBACK_ONLY, resolver=no_dns)
    slow = SitePage(ARTICLE, delay_s=0.3)
    with LoopbackServer(make_site_app({"/p": slow})) as server:
        started = time.monotonic()
        url = f"{server.url}/p"
        threads = [threading.Thread(target=serial.fetch, args=(url,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert time.monotonic() - started >= 0.6  # two 0.3 s responses, one at a time


def test_extract_page_reports_captcha_interstitial_as_blocked(
    site: Site, fetcher: HttpxFetcher
) -> None:
    with pytest.raises(BlockedURL, match="interstitial"):
        fetch_page(site.url("/captcha"), fetcher, extract_timeout_s=5.0)


def test_extract_page_keeps_short_article_with_captcha_comment_form() -> None:
    # A reCAPTCHA widget in a comment form is not a challenge page (extraction benchmark).
    form = '<form id="comments"><div class="g-recaptcha" data-sitekey="k"></div></form>'
    html = ARTICLE.replace("</article>", "</article>" + form)
    download = Download(url="https://example.org/a", final_url="https://example.org/a",
                        status=200, content_type="text/html", body=html.encode())  # fmt: skip
    assert "Lithium plating" in extract_page(download).text


_FORMATTED = (
    "<html><head><title>Tide\u200btables</title></head><body><article>"
    "<p>The word is said \u200b/ta\u026ad/ in English, written in Hebrew as "
    "\u200e\u05d2\u05d0\u05d5\u05ea\u200e, with a soft&shy;hyphen, a zero&#8203;width "
    "space and a family \U0001f469\u200d\U0001f469\u200d\U0001f467 of three.</p>"
    "<p>Tide tables list the times and heights of high and low water for each day of the "
    "year, computed from harmonic constants measured at each port over many months.</p>"
    "</article></body></html>"
)


def _visible(markup: str) -> str:
    return " ".join(html_module.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def test_format_characters_survive_extraction_so_text_is_verbatim_in_the_page() -> None:
    download = Download(url="https://example.org/t", final_url="https://example.org/t",
                        status=200, content_type="text/html", body=_FORMATTED.encode())  # fmt: skip
    page = extract_page(download)
    assert page.title == "Tide\u200btables"
    for kept in ("\u200b/ta\u026ad/", "\u200e\u05d2", "soft\u00adhyphen", "zero\u200bwidth",
                 "\U0001f469\u200d\U0001f469\u200d\U0001f467"):  # fmt: skip
        assert kept in page.text
    for line in page.text.splitlines():
        assert " ".join(line.split()) in _visible(_FORMATTED)


def test_page_already_holding_a_stand_in_character_is_extracted_as_before() -> None:
    markup = _FORMATTED.replace("of three.", "of three \U0001f700.")
    download = Download(url="https://example.org/t", final_url="https://example.org/t",
                        status=200, content_type="text/html", body=markup.encode())  # fmt: skip
    text = extract_page(download).text
    assert "\U0001f700" in text and "\u200b" not in text and "zerowidth" in text


@pytest.mark.parametrize(
    ("markup", "found"),
    [
        ('<div id="CF-Challenge-Form">', "cf-challenge"),
        ('<script src="/cdn-cgi/challenge-platform/x">', "challenge-platform"),
        ('<form class="g-recaptcha">', None),
    ],
)
def test_short_page_with_challenge_markup_is_an_interstitial(
    markup: str, found: str | None
) -> None:
    assert detect_interstitial("Example", "One moment.", f"<html>{markup}</html>") == found
    assert detect_interstitial("Example", "x " * 1500, f"<html>{markup}</html>") is None


def test_extract_page_rejects_near_empty_page(site: Site, fetcher: HttpxFetcher) -> None:
    with pytest.raises(ExtractionError):
        fetch_page(site.url("/empty"), fetcher, extract_timeout_s=5.0)


def test_extract_page_gives_up_after_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def stuck(*args: object, **kwargs: object) -> None:
        time.sleep(1.0)

    monkeypatch.setattr(trafilatura, "bare_extraction", stuck)
    download = Download(
        url="http://127.0.0.1/x",
        final_url="http://127.0.0.1/x",
        status=200,
        content_type="text/html",
        body=ARTICLE.encode(),
    )
    started = time.monotonic()
    with pytest.raises(ExtractionError, match="took over"):
        extract_page(download, timeout_s=0.1)
    assert time.monotonic() - started < 0.5


def test_revalidations_reuse_kept_alive_connections_and_report_failures() -> None:
    ports: list[int] = []
    inner = make_site_app({"/p": SitePage(ARTICLE)})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("client"):
            ports.append(scope["client"][1])  # the client's port: one per TCP connection
        await inner(scope, receive, send)

    fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=no_dns)
    assert isinstance(fetcher, BatchFetcher)
    try:
        with LoopbackServer(app) as server:
            first = fetcher.fetch(f"{server.url}/p")
            again = Revalidation(f"{server.url}/p", etag=first.etag)
            requests = [again] * 5 + [Revalidation(f"{server.url}/missing", etag='"gone"'),
                                      Revalidation("ftp://127.0.0.1/p")]  # fmt: skip
            results = dict(fetcher.fetch_many(requests, window=1))
            assert fetcher.fetch(f"{server.url}/p", etag=first.etag).status == 304
    finally:
        fetcher.close()
    assert [results[i].status for i in range(5)] == [304] * 5  # type: ignore[union-attr]
    missing, refused = results[5], results[6]
    assert isinstance(missing, HTTPStatusError) and missing.status == 404
    assert isinstance(refused, BlockedURL)
    # The revalidations (5 x 304, then the 404 read to its end) share one kept-alive
    # connection of the lean path; the two plain fetches share one of the httpx pool.
    assert len(ports) == 8, ports
    assert len(set(ports[1:7])) == 1 and ports[0] == ports[7] != ports[1]


def _revalidate(fetcher: HttpxFetcher, url: str, etag: str) -> Download | FetchError:
    [(_, result)] = list(fetcher.fetch_many([Revalidation(url, etag=etag)], window=1))
    return result


def test_revalidation_of_a_changed_page_downloads_it_once(
    site: Site, fetcher: HttpxFetcher
) -> None:
    before = site.hits["/article"]
    result = _revalidate(fetcher, site.url("/article"), '"v0"')
    assert isinstance(result, Download) and result.status == 200
    assert b"Lithium plating" in result.body and result.etag == '"v1"'
    assert result.content_type == "text/html"
    assert site.hits["/article"] - before == 1


@pytest.mark.parametrize(("path", "error"), [("/huge", ContentTooLarge), ("/bomb", ContentTooLarge),
                                             ("/pdf", UnsupportedContent),
                                             ("/binary-as-html", UnsupportedContent)])  # fmt: skip
def test_revalidation_answered_with_a_body_keeps_every_cap(
    site: Site, fetcher: HttpxFetcher, path: str, error: type[FetchError]
) -> None:
    assert isinstance(_revalidate(fetcher, site.url(path), '"v0"'), error)


def test_revalidation_of_a_redirect_is_followed_by_the_full_path(
    site: Site, fetcher: HttpxFetcher
) -> None:
    result = _revalidate(fetcher, site.url("/hop"), '"v1"')
    assert isinstance(result, Download) and result.final_url == site.url("/article")
    assert isinstance(_revalidate(fetcher, site.url("/loop"), '"v1"'), FetchError)


def test_revalidation_never_connects_to_a_forbidden_address(
    site: Site, fetcher: HttpxFetcher
) -> None:
    named = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY,
                         resolver=lambda host, port: ["127.0.0.2"])  # fmt: skip
    port = site.other.url.rsplit(":", 1)[1]
    try:
        for guarded, url in (
            (fetcher, f"{site.other.url}/"),
            (named, f"http://other.test:{port}/"),
        ):
            assert isinstance(_revalidate(guarded, url, '"v1"'), BlockedURL)
    finally:
        named.close()
    assert site.other_hits.total() == 0


def test_revalidation_of_a_hanging_page_times_out(site: Site, fetcher: HttpxFetcher) -> None:
    started = time.monotonic()
    assert isinstance(_revalidate(fetcher, site.url("/slow"), '"v1"'), FetchTimeout)
    assert time.monotonic() - started < SETTINGS.total_timeout_s + MARGIN_S


def test_revalidation_reconnects_when_the_server_dropped_the_kept_connection() -> None:
    """A server that closes every connection after its 304 (without saying so)."""
    accepted: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                conn.sendall(b'HTTP/1.1 304 Not Modified\r\nETag: "a"\r\n\r\n')

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/p"
    fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=no_dns)
    try:
        results = [_revalidate(fetcher, url, '"a"') for _ in range(3)]
    finally:
        fetcher.close()
        listener.close()
    assert [getattr(r, "status", r) for r in results] == [304, 304, 304]
    assert len(accepted) == 3


def test_revalidation_of_a_refused_connection_is_one_fetch_error(fetcher: HttpxFetcher) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connections are refused
    result = _revalidate(fetcher, f"http://127.0.0.1:{port}/p", '"v1"')
    assert type(result) is FetchError and "cannot connect" in str(result)
    assert result.url == f"http://127.0.0.1:{port}/p"
