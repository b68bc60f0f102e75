"""A page's author and language reach its bundle source: declared first, else detected."""

from __future__ import annotations

import pytest

from tests.fetch_site import ARTICLE
from webctx.models import Download
from webctx.stages.fetch import extract_page
from webctx.stages.language import detect_language, normalise_tag

_FRENCH = (
    "<p>La marée est le mouvement montant puis descendant des eaux des mers et des océans, "
    "causé par l'effet conjugué des forces de gravitation de la Lune et du Soleil.</p>"
    "<p>Les horaires des marées sont calculés à partir de constantes harmoniques mesurées "
    "dans chaque port pendant de nombreux mois, puis publiés chaque année.</p>"
)


def _page(html: str, content_type: str = "text/html") -> Download:
    return Download(url="https://example.org/a", final_url="https://example.org/a", status=200,
                    content_type=content_type, body=html.encode())  # fmt: skip


_BARE = ARTICLE.replace('<html lang="en">', "<html>", 1).replace(
    '<meta name="author" content="Ada Volta">\n', "", 1
)
"""The test article declaring neither language nor author."""


def _article(head: str = "", html_attrs: str = "") -> str:
    return _BARE.replace("<html>", f"<html{html_attrs}>", 1).replace("<head>", "<head>" + head, 1)


@pytest.mark.parametrize(
    ("raw", "tag"),
    [("en", "en"), ("EN_us", "en-US"), ("zh-hant-tw", "zh-Hant-TW"), ("pt-br", "pt-BR"),
     ("de, en", "de"), ("*", None), ("", None), ("english language", None)],
)  # fmt: skip
def test_language_tags_are_normalised_to_bcp47_case(raw: str, tag: str | None) -> None:
    assert normalise_tag(raw) == tag


def test_the_declared_html_lang_is_the_pages_language() -> None:
    assert "<html>" in _BARE and "Ada Volta" not in _BARE  # what the helper relies on
    assert extract_page(_page(_article(html_attrs=' lang="en-gb"'))).language == "en-GB"


def test_a_content_language_meta_declares_the_language_when_html_lang_is_absent() -> None:
    head = '<meta http-equiv="Content-Language" content="nl">'
    assert extract_page(_page(_article(head=head))).language == "nl"


def test_a_page_that_declares_nothing_gets_its_detected_language() -> None:
    french = _BARE.split("<article>")[0] + "<article>" + _FRENCH + "</article></body></html>"
    assert extract_page(_page(french)).language == "fr"
    assert extract_page(_page(_article())).language == "en"


def test_plain_text_gets_its_detected_language() -> None:
    text = "Die Gezeiten sind die Wasserbewegungen der Ozeane, die durch den Mond entstehen. " * 3
    assert extract_page(_page(text, "text/plain")).language == "de"


def test_too_little_text_to_tell_gives_no_language() -> None:
    assert detect_language("ok 42 — 7") is None


def test_author_from_meta_and_language_reach_the_bundle_source() -> None:
    from datetime import UTC, datetime

    from webctx.models import BundleStats, Chunk, ScoredChunk
    from webctx.stages.bundle import build_bundle, render_markdown

    head = '<meta name="author" content="Jane Doe">'
    page = extract_page(_page(_article(head=head, html_attrs=' lang="en"')))
    assert page.author == "Jane Doe"
    chunk = Chunk(content_sha256=page.content_sha256, index=0, start=0, end=20,
                  text=page.text[:20], tokens=5)  # fmt: skip
    bundle = build_bundle(
        job_id="job", question="q", queries=["q"], pages={page.content_sha256: page},
        ranked=[ScoredChunk(chunk=chunk, url=page.url, score=0.9)], failures=[],
        stats=BundleStats(),
    )  # fmt: skip
    source = bundle.sources[0]
    assert (source.author, source.language) == ("Jane Doe", "en")
    assert source.published is None or len(source.published) == 10
    assert "Jane Doe; en;" in render_markdown(bundle)
    assert datetime.now(UTC) >= source.fetched_at
