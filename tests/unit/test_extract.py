"""Extraction: interstitials, format characters kept verbatim, challenge markup."""

from __future__ import annotations

import html as html_module
import re

import pytest

from tests.fetch_site import ARTICLE, Site
from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.errors import BlockedURL
from webctx.models import Download
from webctx.stages.fetch import detect_interstitial, extract_page, fetch_page
from webctx.stages.visibility import strip_invisible


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


def test_format_characters_survive_extraction_unless_they_hide_or_split_words() -> None:
    download = Download(url="https://example.org/t", final_url="https://example.org/t",
                        status=200, content_type="text/html", body=_FORMATTED.encode())  # fmt: skip
    page = extract_page(download)
    assert page.title == "Tidetables"  # a zero-width space splits words for filters, not eyes
    for kept in ("said /ta\u026ad/", "\u200e\u05d2", "softhyphen", "zerowidth",
                 "\U0001f469\u200d\U0001f469\u200d\U0001f467"):  # fmt: skip
        assert kept in page.text
    assert not set("\u200b\u00ad") & set(page.text)
    for line in page.text.splitlines():  # verbatim, but for the word splitters dropped
        assert " ".join(line.split()) in strip_invisible(_visible(_FORMATTED))


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
