"""Publishers' opt-outs beyond robots.txt: X-Robots-Tag, meta robots, the W3C TDM
Reservation Protocol, what a job and the index do with them, and the product token."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from tests.factories import make_page, make_scored
from webctx.adapters.http_body import kept_headers
from webctx.errors import OptedOut
from webctx.jobs.reservations import download_opt_outs, marked, refused_copy
from webctx.models import BundleStats, Download
from webctx.net.optouts import (
    OptOuts,
    header_opt_outs,
    meta_opt_outs,
    page_opt_outs,
    robots_directives,
    tdmrep_rules,
)
from webctx.net.politeness import Politeness, robots_rules
from webctx.settings import FetchSettings, agent_has_token
from webctx.stages.bundle import build_bundle, render_markdown

TOKEN = "webctx"


def download(
    *, headers: list[tuple[str, str]] | None = None, body: str = "", tdmrep: str | None = None,
    status: int = 200, content_type: str = "text/html",
) -> Download:  # fmt: skip
    return Download(url="https://a.test/p", final_url="https://a.test/p", status=status,
                    content_type=content_type, body=body.encode(), headers=headers or [],
                    tdmrep_rule=tdmrep)  # fmt: skip


# -- X-Robots-Tag (Google's syntax) --------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["noai"], OptOuts("X-Robots-Tag: noai", None)),
        (["noindex, nofollow"], OptOuts(None, "X-Robots-Tag: noindex")),
        (["none"], OptOuts("X-Robots-Tag: none", "X-Robots-Tag: none")),
        (["NoAI, NOINDEX"], OptOuts("X-Robots-Tag: noai", "X-Robots-Tag: noindex")),
        (["webctx: noai"], OptOuts("X-Robots-Tag: webctx: noai", None)),
        (["WebCtx: none"], OptOuts("X-Robots-Tag: webctx: none", "X-Robots-Tag: webctx: none")),
        (["otherbot: noai, noindex"], OptOuts()),  # another crawler's scope, to its end
        (["googlebot: noindex", "noai"], OptOuts("X-Robots-Tag: noai", None)),  # each header
        (["webctx-test: noai"], OptOuts()),  # a name is matched whole
        (["unavailable_after: 25 Jun 2010 15:00:00 PST, noai"], OptOuts("X-Robots-Tag: noai")),
        (["noimageai, nosnippet, max-snippet: 20"], OptOuts()),  # images and snippets: no text
        ([], OptOuts()),
    ],
)
def test_x_robots_tag_directives_for_our_token(values: list[str], expected: OptOuts) -> None:
    headers = [("x-robots-tag", value) for value in values]
    assert header_opt_outs(headers, TOKEN) == expected


def test_x_robots_tag_scope_lasts_to_the_end_of_its_header() -> None:
    found = robots_directives(["otherbot: noindex, noai", "webctx: nofollow, noai"], TOKEN)
    assert found == [("nofollow", "webctx"), ("noai", "webctx")]


# -- meta tags -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ('<meta name="robots" content="noai, noimageai">', OptOuts('meta name="robots": noai')),
        ("<META NAME='ROBOTS' CONTENT='NOINDEX'>", OptOuts(None, 'meta name="robots": noindex')),
        ('<meta name="webctx" content="none">',
         OptOuts('meta name="webctx": none', 'meta name="webctx": none')),
        ('<meta content="noai" name="otherbot">', OptOuts()),
        ('<meta name="robots" content="noimageai">', OptOuts()),
        ('<meta name="tdm-reservation" content="1">', OptOuts('meta name="tdm-reservation": 1')),
        ('<meta name="tdm-reservation" content="1"><meta name="tdm-policy" '
         'content="https://a.test/policy.json">',
         OptOuts('meta name="tdm-reservation": 1 (policy https://a.test/policy.json)')),
        ('<meta name="tdm-reservation" content="0">', OptOuts()),
        ('<meta property="og:title" content="noai">', OptOuts()),
    ],
)  # fmt: skip
def test_meta_robots_and_tdm_reservation(head: str, expected: OptOuts) -> None:
    html = f"<html><head><title>t</title>{head}</head><body><p>text</p></body></html>"
    assert meta_opt_outs(html.encode(), TOKEN) == expected


def test_meta_tags_are_read_in_html_only() -> None:
    text = '<meta name="robots" content="noai">'
    assert page_opt_outs(download(body=text, content_type="text/plain"), TOKEN) == OptOuts()
    assert page_opt_outs(download(body=text), TOKEN).reserved == 'meta name="robots": noai'


# -- TDMRep: header and tdmrep.json ---------------------------------------------------------


def test_tdm_reservation_header_reserves_with_its_policy() -> None:
    headers = [("tdm-reservation", "1"), ("tdm-policy", "https://a.test/p.json")]
    assert header_opt_outs(headers, TOKEN).reserved == (
        "tdm-reservation: 1 (policy https://a.test/p.json)"
    )
    assert header_opt_outs([("tdm-reservation", "0")], TOKEN) == OptOuts()


TDMREP = [
    {"location": "/public/*", "tdm-reservation": 0},
    {"location": "/*.pdf$", "tdm-reservation": 1, "tdm-policy": "https://a.test/policy.json"},
    {"location": "/private/*", "tdm-reservation": 1},
    {"location": "/", "tdm-reservation": 0},
]


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("/private/notes", "tdmrep.json: /private/* tdm-reservation=1"),
        ("/private/", "tdmrep.json: /private/* tdm-reservation=1"),
        ("/public/private/x", None),  # the first matching rule decides
        ("/public/report.pdf", None),
        ("/docs/report.pdf",
         "tdmrep.json: /*.pdf$ tdm-reservation=1 (policy https://a.test/policy.json)"),
        ("/docs/report.pdf.html", None),  # `$` anchors
        ("/about", None),
    ],
)  # fmt: skip
def test_tdmrep_json_first_matching_location_decides(path: str, rule: str | None) -> None:
    rules = tdmrep_rules(200, json.dumps(TDMREP).encode())
    assert rules.decide(f"https://a.test{path}") == rule


@pytest.mark.parametrize(
    ("status", "body"),
    [(404, b""), (500, b""), (200, b"not json"), (200, b'{"location": "/"}'), (200, b"[]")],
)
def test_tdmrep_json_missing_or_broken_reserves_nothing(status: int, body: bytes) -> None:
    assert tdmrep_rules(status, body).decide("https://a.test/anything") is None


def test_tdmrep_json_bad_entries_are_skipped_the_others_kept() -> None:
    body = json.dumps([{"location": 3}, "x", {"location": "/a", "tdm-reservation": 7},
                       {"location": "/a", "tdm-reservation": "1"}]).encode()  # fmt: skip
    assert tdmrep_rules(200, body).decide("https://a.test/a/b") == (
        "tdmrep.json: /a tdm-reservation=1"
    )


def test_header_rule_is_named_before_tdmrep_and_meta() -> None:
    got = page_opt_outs(download(headers=[("x-robots-tag", "noai")], tdmrep="tdmrep.json: /",
                                 body='<meta name="robots" content="noai">'), TOKEN)  # fmt: skip
    assert got.reserved == "X-Robots-Tag: noai"
    got = page_opt_outs(download(tdmrep="tdmrep.json: / tdm-reservation=1"), TOKEN)
    assert got.reserved == "tdmrep.json: / tdm-reservation=1"


# -- what a job and the index do ---------------------------------------------------------


def test_honoured_reservation_refuses_the_download_naming_the_rule() -> None:
    with pytest.raises(OptedOut, match="X-Robots-Tag: noai") as raised:
        download_opt_outs(FetchSettings(), download(headers=[("x-robots-tag", "noai")]), None)
    assert raised.value.reason == "opted_out"


def test_reported_reservation_marks_the_page_and_noindex_never_refuses() -> None:
    report = FetchSettings(opt_outs="report")
    found = download_opt_outs(report, download(headers=[("x-robots-tag", "noai")]), None)
    page = marked(make_page(), found)
    assert page.opt_out == "X-Robots-Tag: noai" and page.noindex is None
    noindex = download(headers=[("x-robots-tag", "noindex")])
    assert download_opt_outs(FetchSettings(), noindex, None).noindex == "X-Robots-Tag: noindex"


def test_a_304_keeps_the_prior_copys_marks_and_a_marked_copy_is_refused_when_honoured() -> None:
    prior = make_page().model_copy(update={"opt_out": 'meta name="robots": noai'})
    with pytest.raises(OptedOut, match="meta name"):
        download_opt_outs(FetchSettings(), download(status=304), prior)
    assert refused_copy(FetchSettings(), prior)
    assert not refused_copy(FetchSettings(opt_outs="report"), prior)
    assert not refused_copy(FetchSettings(), make_page())


# -- the product token ---------------------------------------------------------------------


def test_a_custom_user_agent_keeps_the_configured_product_token_for_robots() -> None:
    settings = FetchSettings(user_agent="Mozilla/5.0 (compatible; webctx/0.1)")
    polite = Politeness.from_settings(settings)
    assert polite.agent == "webctx"  # not "mozilla"
    rules = robots_rules(200, b"User-agent: webctx\nDisallow: /private\n", user_agent=polite.agent)
    assert not rules.allows("https://a.test/private/x")


def test_a_user_agent_without_the_product_token_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="PRODUCT_TOKEN"):
        FetchSettings(user_agent="MyBot/1.0 (+https://example.org)")
    with pytest.raises(ValidationError, match="PRODUCT_TOKEN"):
        FetchSettings(user_agent="webctx-fork/1.0")  # a longer name is another name
    assert FetchSettings(user_agent="MyBot/1.0", product_token="MyBot").product_token == "MyBot"


@pytest.mark.parametrize(
    ("agent", "token", "has"),
    [("webctx/0.1", "webctx", True), ("Mozilla/5.0 (compatible; WebCtx/0.1)", "webctx", True),
     ("webctxbot/1", "webctx", False), ("my-webctx/1", "webctx", False)],
)  # fmt: skip
def test_agent_has_token_matches_a_whole_product_name(agent: str, token: str, has: bool) -> None:
    assert agent_has_token(agent, token) is has


def test_product_token_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from webctx.settings import Settings

    monkeypatch.setenv("WEBCTX_FETCH__PRODUCT_TOKEN", "acmebot")
    monkeypatch.setenv("WEBCTX_FETCH__USER_AGENT", "AcmeBot/2.0 (+https://acme.test)")
    monkeypatch.setenv("WEBCTX_FETCH__OPT_OUTS", "report")
    fetch = Settings().fetch
    assert (fetch.product_token, fetch.opt_outs) == ("acmebot", "report")
    monkeypatch.setenv("WEBCTX_FETCH__OPT_OUTS", "ignore")
    with pytest.raises(ValidationError, match="opt_outs"):
        Settings()


def test_a_reported_opt_out_is_marked_on_its_bundle_source_and_in_the_markdown() -> None:
    page = make_page(opt_out="X-Robots-Tag: noai")
    plain = make_page(url="https://example.org/other")
    bundle = build_bundle(job_id="j", question="q", queries=[], failures=[],
                          pages={p.content_sha256: p for p in (page, plain)},
                          ranked=[make_scored(page=page, score=0.9),
                                  make_scored(page=plain, score=0.5)],
                          stats=BundleStats())  # fmt: skip
    assert [s.opt_out for s in bundle.sources] == ["X-Robots-Tag: noai", None]
    lines = [line for line in render_markdown(bundle).splitlines() if line.startswith("- [")]
    assert "publisher opted out: X-Robots-Tag: noai (reported, not honoured)" in lines[0]
    assert "opted out" not in lines[1]


def test_every_value_of_a_repeated_opt_out_header_is_kept_in_order() -> None:
    multi = httpx.Headers([("X-Robots-Tag", "googlebot: noindex"), ("Content-Type", "text/html"),
                           ("x-robots-tag", "noai"), ("TDM-Reservation", "1")])  # fmt: skip
    expected = [("x-robots-tag", "googlebot: noindex"), ("x-robots-tag", "noai"),
                ("tdm-reservation", "1")]  # fmt: skip
    assert kept_headers(multi) == expected
    # The lean revalidation path joins a repeated header's values by newlines.
    joined = {"x-robots-tag": "googlebot: noindex\nnoai", "tdm-reservation": "1", "etag": '"x"'}
    assert kept_headers(joined) == expected
    assert header_opt_outs(expected, TOKEN).reserved == "X-Robots-Tag: noai"
