"""The fetcher against a hostile loopback site (tests/fetch_site.py): what it fetches,
every cap, redirects and the address guard.

Only 127.0.0.1 and 127.0.0.2 are ever targeted, and every resolver is a stub, so no
packet leaves loopback even if the guard were broken.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
import tracemalloc

import pytest

from tests.fetch_site import (
    ARTICLE,
    LOOPBACK_ONLY,
    SETTINGS,
    Site,
    no_dns,
    timed_failure,
)
from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.errors import (
    BlockedURL,
    ContentTooLarge,
    ExtractionError,
    FetchError,
    HTTPStatusError,
    InvalidRedirect,
    UnsupportedContent,
)
from webctx.net.addresses import AddressPolicy
from webctx.stages.fetch import fetch_page


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


@pytest.mark.parametrize("path", ["/not-a-pdf", "/png", "/binary-as-html"])
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


def test_redirect_to_an_unparsable_url_fails_as_invalid_redirect(
    site: Site, fetcher: HttpxFetcher, caplog: pytest.LogCaptureFixture
) -> None:
    before = site.hits["/to-data"]
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidRedirect) as info:
        fetcher.fetch(site.url("/to-data"))
    assert info.value.reason == "invalid_redirect" and info.value.url == site.url("/to-data")
    assert site.hits["/to-data"] == before + 1  # the site really sent that Location
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


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


def test_extract_page_rejects_near_empty_page(site: Site, fetcher: HttpxFetcher) -> None:
    with pytest.raises(ExtractionError):
        fetch_page(site.url("/empty"), fetcher, extract_timeout_s=5.0)
