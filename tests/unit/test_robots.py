"""robots.txt matching (webctx.net.robots) on RFC 9309's own examples and rules."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from webctx.net.politeness import robots_rules
from webctx.net.robots import MAX_PARSE_BYTES, Decision, normalise, parse_robots, product_token

CASES = Path(__file__).resolve().parents[2] / "bench" / "robots_cases" / "cases.json"

# RFC 9309 section 5.1.
SIMPLE = """User-Agent: *
Disallow: *.gif$
Disallow: /example/
Allow: /publications/

User-Agent: foobot
Disallow:/
Allow:/example/page.html
Allow:/example/allowed.gif

User-Agent: barbot
User-Agent: bazbot
Disallow: /example/page.html

User-Agent: quxbot
"""


@pytest.mark.parametrize(
    ("agent", "path", "allowed"),
    [
        ("foobot", "/example/page.html", True),
        ("foobot", "/example/allowed.gif", True),
        ("foobot", "/example/other.html", False),
        ("barbot", "/example/page.html", False),
        ("bazbot", "/example/page.html", False),
        ("bazbot", "/picture.gif", True),  # its own group: the * group's rules do not apply
        ("quxbot", "/example/page.html", True),  # a group without rules allows everything
        ("otherbot", "/picture.gif", False),
        ("otherbot", "/picture.gif?x=1", True),  # $ ends the pattern
        ("otherbot", "/example/page.html", False),
        ("otherbot", "/publications/cover.gif", True),  # longer Allow beats *.gif$
    ],
)
def test_rfc_simple_example(agent: str, path: str, allowed: bool) -> None:
    assert parse_robots(SIMPLE).decide(path, agent).allowed is allowed


def test_rfc_longest_match_decides_and_names_its_rule() -> None:
    robots = parse_robots(
        "User-Agent: foobot\nAllow: /example/page/\nDisallow: /example/page/disallowed.gif\n"
    )
    assert robots.decide("/example/page/", "foobot") == Decision(
        True, "Allow: /example/page/", 2
    )
    refused = robots.decide("/example/page/disallowed.gif", "foobot")
    assert refused == Decision(False, "Disallow: /example/page/disallowed.gif", 3)
    assert refused.reason() == (
        "disallowed by robots.txt line 3: Disallow: /example/page/disallowed.gif"
    )


def test_first_line_does_not_win_over_a_longer_one_and_allow_wins_a_tie() -> None:
    robots = parse_robots(
        "User-agent: *\nDisallow: /shop/\nAllow: /shop/public/\nDisallow: /same\nAllow: /same\n"
    )
    assert not robots.decide("/shop/cart", "webctx").allowed
    assert robots.decide("/shop/public/item", "webctx").allowed
    assert robots.decide("/same/x", "webctx") == Decision(True, "Allow: /same", 5)


def test_groups_for_one_agent_merge_and_blank_lines_end_nothing() -> None:
    robots = parse_robots(
        "user-agent: ExampleBot\ndisallow: /foo\n\ndisallow: /bar\n\n"
        "user-agent: other\nuser-agent: examplebot\ndisallow: /baz\n"
    )
    for path in ("/foo", "/bar", "/baz"):
        assert not robots.decide(path, "ExampleBot").allowed, path
    assert robots.decide("/qux", "ExampleBot").allowed
    assert not robots.decide("/baz", "other").allowed  # consecutive agent lines share


def test_product_token_matches_whole_and_case_insensitively() -> None:
    robots = parse_robots(
        "User-agent: web\nDisallow: /\n\nUser-agent: WEBCTX/2.0\nDisallow: /mine\n\n"
        "User-agent: otherbot crawler\nDisallow: /other\n\nUser-agent: *\nDisallow: /all\n"
    )
    ours = "webctx/0.1 (+https://example.invalid/bot)"
    assert product_token(ours) == "webctx"
    assert robots.decide("/page", ours).allowed  # `web` is not `webctx`
    assert not robots.decide("/mine", ours).allowed  # a version after the token
    assert robots.decide("/all", ours).allowed  # named: the * group does not apply
    assert not robots.decide("/other", "OtherBot").allowed  # a space after the token
    assert not robots.decide("/all", "nobody").allowed


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/foo/bar/%62%61%7A", "/foo/bar/baz", True),  # RFC 9309 2.2.2 table
        ("/foo/bar/\u30c4", "/foo/bar/%E3%83%84", True),
        ("/foo/bar/%E3%83%84", "/foo/bar/%e3%83%84", True),
        ("/foo/bar?baz=quz", "/foo/bar?baz=quz", True),
        ("/a%2Fb", "/a/b", False),  # an escaped reserved octet stays distinct
        ("/a/b", "/a%2fb", False),
        ("/path/file-with-a-%2A.html", "/path/file-with-a-*.html", True),  # 2.2.3
        ("/path/file-with-a-%2A.html", "/path/file-with-a-b.html", False),
        ("/path/foo-%24", "/path/foo-$", True),
        ("/this/path/exactly$", "/this/path/exactly", True),
        ("/this/path/exactly$", "/this/path/exactly/more", False),
        ("/this/*/exactly", "/this/any/thing/exactly", True),
        ("/x$/y", "/x$/yz", True),  # a `$` inside a pattern is the character
        ("*.gif$", "/a/b.gif", True),
        ("/a<*", "/a%3cd", True),
    ],
)
def test_patterns_match_after_normalising_percent_encoding(
    pattern: str, path: str, matches: bool
) -> None:
    robots = parse_robots(f"User-agent: *\nDisallow: {pattern}\n")
    assert robots.decide(path, "webctx").allowed is not matches


def test_normalise_decodes_unreserved_and_keeps_reserved_escaped() -> None:
    assert normalise("/%7ejoe/%3c%2f") == "/~joe/%3C%2F"
    assert normalise("/a b/ä") == "/a%20b/%C3%A4"


def test_robots_txt_itself_is_always_allowed() -> None:
    robots = parse_robots("User-agent: *\nDisallow: /\n")
    assert robots.decide("http://a.test/robots.txt", "webctx").allowed
    assert not robots.decide("http://a.test/a/robots.txt", "webctx").allowed


def test_byte_order_mark_is_ignored() -> None:
    robots = parse_robots(b"\xef\xbb\xbfUser-agent: *\nDisallow: /private\n")
    assert not robots.decide("/private", "webctx").allowed


def test_only_the_first_500_kib_are_parsed() -> None:
    filler = b"# " + b"x" * 1000 + b"\n"
    body = b"User-agent: *\nDisallow: /early\n" + filler * (MAX_PARSE_BYTES // len(filler) + 1)
    body += b"Disallow: /late\n"
    robots = parse_robots(body)
    assert not robots.decide("/early", "webctx").allowed
    assert robots.decide("/late", "webctx").allowed


def test_crawl_delay_takes_fractions_and_ignores_nonsense() -> None:
    robots = parse_robots(
        "User-agent: webctx\nCrawl-delay: 0.5\n\nUser-agent: a\nCrawl-delay: -1\n"
        "User-agent: b\nCrawl-delay: soon\n"
    )
    assert robots.crawl_delay("webctx/0.1") == 0.5
    assert robots.crawl_delay("a") is None and robots.crawl_delay("b") is None
    rules = robots_rules(200, b"User-agent: *\nCrawl-delay: 0.5\n", user_agent="webctx/0.1")
    assert rules.crawl_delay == 0.5  # the standard library's parser ignored fractions


def test_many_wildcards_do_not_backtrack() -> None:
    robots = parse_robots("User-agent: *\nDisallow: /a/" + "*a" * 200 + "b\n")
    started = time.perf_counter()
    assert robots.decide("/a/" + "a" * 5000 + "c", "webctx").allowed
    assert time.perf_counter() - started < 1.0


def test_decides_every_case_of_the_benchmark_file() -> None:
    wrong = []
    for group in json.loads(CASES.read_text()):
        robots = parse_robots(group["robots"].encode())
        for agent, path, allowed in group["checks"]:
            if robots.decide(path, agent).allowed is not allowed:
                wrong.append((group["source"], agent, path))
    assert wrong == []


def test_a_refusal_reason_is_valid_text_whatever_the_file_holds() -> None:
    robots = parse_robots(b"User-agent: *\nDisallow: /\xff" + b"x" * 500 + b"\n")
    decision = robots.decide("/%FF" + "x" * 500, "webctx")
    assert not decision.allowed and decision.rule is not None
    decision.reason().encode("utf-8")  # no lone surrogate from the undecodable byte
    assert len(decision.rule) < 220

