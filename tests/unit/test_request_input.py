"""What a job request holds once validated, whatever way it came in: a question without
terminal control sequences or invisible characters, domain filters as host names."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from webctx.models import JobRequest, clean_text, host_name
from webctx.stages.plan import plan_queries
from webctx.stages.search import merge_results

HOSTILE_QUESTION = (
    "\x1b]0;owned\x07how do\x1b[2J\x1b[H lithium\x00 batteries\x0c degrade?\x1bc"
    "\u202e\x9b31m\x1b]8;;http://127.0.0.2/\x1b\\ now\x1b]8;;\x1b\\\U000e0041"
)


def test_a_questions_control_sequences_and_invisible_characters_are_stripped() -> None:
    request = JobRequest(question=HOSTILE_QUESTION)
    assert request.question == "how do lithium batteries degrade? now"
    assert plan_queries(request.question, max_queries=4)
    for query in plan_queries(request.question, max_queries=4):
        assert query.isprintable()


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("tab\tnew\nline\r\n end", "tab new line end"),  # whitespace collapsed, not dropped
        ("naïve café, 日本語? ok", "naïve café, 日本語? ok"),
        ("zero\u200bwidth\ufeff and\u2066 isolate\u2069", "zerowidth and isolate"),
        ("keep\u200cnon-joiner", "keep\u200cnon-joiner"),  # Persian and Indic spelling
        ("unterminated \x1b]0;title", "unterminated 0;title"),  # shown, no longer acted on
        ("bell\x07 del\x7f nel\x85line", "bell del nel line"),
    ],
)
def test_clean_text_keeps_what_a_reader_sees(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


def test_a_question_of_control_characters_alone_is_refused() -> None:
    with pytest.raises(ValidationError, match="question must contain text"):
        JobRequest(question="\x1b[2J\x00\x07")


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("example.com", "example.com"),
        ("Example.COM.", "example.com"),
        ("*.example.com", "example.com"),  # a filter covers subdomains anyway
        ("  news.example.org ", "news.example.org"),
        ("bücher.de", "xn--bcher-kva.de"),
        ("BÜCHER.de", "xn--bcher-kva.de"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("日本.jp", "xn--wgv71a.jp"),
        ("gov", "gov"),  # a top-level domain: every .gov site
    ],
)
def test_domains_are_host_names_in_their_idna_form(raw: str, name: str) -> None:
    assert host_name(raw) == name
    assert JobRequest(question="q", exclude_domains=[raw]).exclude_domains == [name]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("file:///etc/passwd", "has a scheme"),
        ("javascript:alert(1)", "has a scheme"),
        ("https://example.com/page", "give its host name alone: example.com"),
        ("example.com:8080", "has a port"),
        ("example.com/path", "has a path"),
        ("user@example.com", "has userinfo"),
        ("1.2.3.4", "is an IP address"),
        ("[::1]", "is an IP address"),
        ("127.1", "ends in a number"),
        ("exa mple.com", "spaces, control or invisible"),
        ("example.com\x00", "spaces, control or invisible"),
        ("exa\u200bmple.com", "spaces, control or invisible"),
        ("under_score.com", "not a valid host name"),
        ("-dash.com", "not a valid host name"),
        ("a..b.com", "not a valid host name"),
        ("a" * 64 + ".com", "not a valid host name"),
        ("", "is empty"),
    ],
)
def test_a_domain_that_is_not_a_host_name_is_refused_naming_it(raw: str, why: str) -> None:
    with pytest.raises(ValidationError) as caught:
        JobRequest(question="q", include_domains=["ok.example", raw])
    (error,) = caught.value.errors()
    assert error["loc"] == ("include_domains", 1)
    assert why in error["msg"] and repr(raw)[:40] in error["msg"]


def test_an_internationalised_results_host_matches_its_filter() -> None:
    from webctx.models import SearchResult

    results = [SearchResult(url="https://www.bücher.de/a", rank=0),
               SearchResult(url="https://other.example/b", rank=1)]  # fmt: skip
    request = JobRequest(question="q", include_domains=["bücher.de"])
    kept = merge_results([results], include_domains=request.include_domains)
    assert [r.url for r in kept] == ["https://www.bücher.de/a"]
