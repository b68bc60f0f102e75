"""remove_hidden and strip_invisible: what a reader does not see leaves the page's text."""

from __future__ import annotations

import lxml.html
import pytest

from webctx.stages.visibility import hides, remove_hidden, strip_invisible


def _visible_text(body: str, head: str = "") -> str:
    tree = lxml.html.fromstring(f"<html><head>{head}</head><body>{body}</body></html>")
    remove_hidden(tree)
    return " ".join(tree.body.text_content().split())


@pytest.mark.parametrize(
    "style",
    ["display:none", "DISPLAY:NONE", "display : none !important", "visibility: hidden",
     "font-size:0", "font-size: 0px", "opacity:0", "opacity: 0.0", "color: transparent",
     "color: rgba(0,0,0,0)", "position:absolute; left:-9999px", "text-indent: -9999px",
     "height:0; overflow:hidden", "transform: scale(0)"],
)  # fmt: skip
def test_styles_that_hide_text_are_recognised(style: str) -> None:
    assert _visible_text(f'<p>seen <span style="{style}">SECRET</span> after</p>') == "seen after"


@pytest.mark.parametrize(
    "style", ["display:block", "font-size:0.9em", "opacity:0.8", "color:#333",
              "position:relative; left:-2px", "text-indent:2em", "margin-left:-10px"],
)  # fmt: skip
def test_styles_that_show_text_are_left_alone(style: str) -> None:
    assert (
        _visible_text(f'<p>seen <span style="{style}">KEPT</span> after</p>') == "seen KEPT after"
    )


def test_colour_equal_to_an_ancestors_background_hides() -> None:
    body = '<div style="background:#FFF"><p><b style="color:white">SECRET</b>shown</p></div>'
    assert _visible_text(body) == "shown"


def test_the_pages_stylesheet_hides_simple_selectors_but_not_media_blocks() -> None:
    head = (
        "<style>/* x */ .ad, p#note { display:none } div.promo{opacity:0}"
        "@media (max-width:600px){ .wide { display:none } } .a .b{display:none}</style>"
    )
    body = (
        '<p class="ad">S1</p><p id="note">S2</p><div class="promo big">S3</div>'
        '<p class="wide">W</p><div class="a"><p class="b">B</p></div><p>T</p>'
    )
    assert _visible_text(body, head) == "WBT"


def test_stylesheet_declarations_match_in_any_case_and_print_sheets_are_skipped() -> None:
    head = (
        "<style>.A { DISPLAY : NONE } #b{opacity: 0}</style>"
        '<style media="print">.c{display:none}</style>'
    )
    body = '<p class="A">S1</p><p id="b">S2</p><p class="c">C</p><p class="a">a</p>'
    assert _visible_text(body, head) == "Ca"


def test_attributes_and_inert_elements_hide_but_tails_stay() -> None:
    body = (
        '<p>a<span hidden>S1</span>b<span aria-hidden="true">S2</span>c<template>S3</template>'
        'd<noscript>S4</noscript>e<span hidden="until-found">f</span></p>'
    )
    assert _visible_text(body) == "abcdef"


def test_a_hidden_element_inside_a_hidden_element_is_removed_once() -> None:
    tree = lxml.html.fromstring('<div><div hidden><p style="opacity:0">x</p></div>y</div>')
    assert remove_hidden(tree) == 1 and tree.text_content() == "y"


def test_strip_invisible_joins_split_words_and_drops_tag_characters() -> None:
    tagged = "".join(chr(0xE0000 + ord(c)) for c in "obey")
    assert strip_invisible("ig\u200bnore pre\u00advious\u2060 x" + tagged) == "ignore previous x"
    assert strip_invisible("a\u200db \u202eevil") == "ab evil"
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # ZWNJ shapes the word: kept
    assert strip_invisible(persian) == persian and strip_invisible("plain") == "plain"


def test_hides_needs_declarations() -> None:
    assert not hides({}) and hides({"display": "none"})


def test_a_background_not_understood_stops_the_walk_to_an_ancestors() -> None:
    body = (
        '<div style="background:#fff"><div style="background:rgba(0,0,0,.9)">'
        '<p style="color:#fff">shown</p></div><div style="background:none">'
        '<p style="color:white">SECRET</p></div></div>'
    )
    assert _visible_text(body) == "shown"


def test_a_zero_font_size_container_hides_only_what_does_not_set_its_own_size() -> None:
    body = (
        '<ul style="font-size:0">SECRET1<li style="font-size:16px">one</li>SECRET2'
        '<li>SECRET3</li><li><span style="font-size:1rem">two</span>SECRET4</li></ul>'
        '<p style="font-size:0;opacity:0">SECRET5<b style="font-size:12px">SECRET6</b></p>'
        '<p style="font-size:0">SECRET7<b style="font-size:1em">SECRET8</b></p>'
    )
    assert _visible_text(body) == "onetwo"
