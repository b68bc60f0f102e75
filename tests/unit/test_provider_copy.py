"""When a search provider's page text may stand in for a download: transport failures
(timeout, no connection, 5xx, the site blocking us) yes; our policy's refusals (robots.txt,
an opt-out, the address guard) and unreadable answers never."""

from __future__ import annotations

import hashlib

import pytest

from webctx.errors import (
    BlockedURL,
    ContentTooLarge,
    ExtractionError,
    FetchError,
    FetchTimeout,
    HTTPStatusError,
    Interstitial,
    NeedsRender,
    OptedOut,
    UnsupportedContent,
)
from webctx.jobs.provider_copy import provider_page, transport_failure
from webctx.models import SearchResult

URL = "https://site.example/page"


@pytest.mark.parametrize(
    "exc",
    [FetchTimeout(URL, "no complete response within 3s"), FetchError(URL, "ConnectError"),
     HTTPStatusError(URL, "HTTP 503", status=503), HTTPStatusError(URL, "HTTP 500", status=500),
     HTTPStatusError(URL, "HTTP 403", status=403), HTTPStatusError(URL, "HTTP 429", status=429),
     Interstitial(URL, "interstitial page ('captcha')")],
)  # fmt: skip
def test_a_transport_failure_lets_the_providers_text_stand_in(exc: FetchError) -> None:
    assert transport_failure(exc)


@pytest.mark.parametrize(
    "exc",
    [BlockedURL(URL, "robots.txt line 2: Disallow: /page"), OptedOut(URL, "X-Robots-Tag: noai"),
     BlockedURL(URL, "address 10.0.0.1 is not allowed"),
     HTTPStatusError(URL, "HTTP 404", status=404),
     HTTPStatusError(URL, "HTTP 410", status=410), ContentTooLarge(URL, "over 2 MB"),
     UnsupportedContent(URL, "image/png"), ExtractionError(URL, "only 3 characters"),
     NeedsRender(URL, "the page is rendered by script")],
)  # fmt: skip
def test_a_refusal_or_an_unreadable_answer_never_takes_the_providers_text(
    exc: FetchError,
) -> None:
    assert not transport_failure(exc)


def test_the_providers_text_is_a_page_with_its_own_hash() -> None:
    text = "Glaciers retreat when summers melt more ice than winters add. " * 4
    result = SearchResult(url=URL + "?ref=x", title="Glaciers", rank=0,
                          content="\u200b" + text + "\n")  # fmt: skip
    page = provider_page(result, URL)
    assert page is not None
    assert page.text == text.strip() and page.url == URL and page.final_url == URL + "?ref=x"
    assert page.content_sha256 == hashlib.sha256(page.text.encode()).hexdigest()
    assert page.site == "site.example" and page.title == "Glaciers"


def test_too_little_provider_text_is_no_page() -> None:
    assert provider_page(SearchResult(url=URL, rank=0, content="a snippet"), URL) is None
    assert provider_page(SearchResult(url=URL, rank=0), URL) is None
