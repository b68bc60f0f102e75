"""What a deep job's next round looks for: the facets that need it, their queries (the
facet alone, then with the terms of its best passages), the same-site links worth
following, and the bounds that stop the rounds."""

from __future__ import annotations

from lxml.html import fromstring

from tests.factories import make_page
from webctx.deep_settings import DeepSettings
from webctx.models import Bundle, BundleChunk, BundleSource, PageLink
from webctx.stages.deepen import (
    FacetCheck,
    Spent,
    check_facets,
    facet_queries,
    pick_links,
    plan_round,
    stop_reason,
)
from webctx.stages.links import same_site_links

FIRST = "When was the Velmora harbour lighthouse built?"
SECOND = "Who tended the beacon lamps during the great storm?"


def _bundle(texts: list[str], pages: list[str] | None = None) -> Bundle:
    urls = pages or ["https://site.example/a"]
    sources = [BundleSource(id=i + 1, url=u, final_url=u, title="", site="", published=None,
                            fetched_at=make_page().fetched_at,
                            content_sha256=make_page(url=u).content_sha256)
               for i, u in enumerate(urls)]  # fmt: skip
    chunks = [BundleChunk(source=1 + i % len(urls), text=t, start=0, end=len(t), tokens=9,
                          score=1.0 - i / 10) for i, t in enumerate(texts)]  # fmt: skip
    return Bundle(job_id="j", question=f"{FIRST} {SECOND}", queries=[], sources=sources,
                  chunks=chunks)  # fmt: skip


def test_a_facet_no_chunk_speaks_of_is_missing_and_one_that_is_covered_is_supported() -> None:
    bundle = _bundle(["The Velmora harbour lighthouse was built in 1871 of granite."])
    first, second = check_facets(bundle, [FIRST, SECOND])
    assert (first.status, first.chunks) == ("supported", [0])
    assert (second.status, second.chunks) == ("missing", [])
    # Two of its five content words (tended, beacon, lamps, great, storm): weak; one: missing.
    assert check_facets(_bundle(["A great storm came in."]), [SECOND])[0].status == "weak"
    assert check_facets(_bundle(["A storm came in."]), [SECOND])[0].status == "missing"


def test_queries_for_a_facet_are_the_facet_alone_then_its_words_with_best_passage_terms() -> None:
    best = ["The keeper Orrin Tallis tended the lamps; Tallis trimmed wicks all night."]
    queries = facet_queries(SECOND, best, sent=[], n=2)
    assert queries[0] == SECOND
    words = queries[1].split()
    assert words[:5] == ["tended", "beacon", "lamps", "great", "storm"]
    assert "Tallis" in words  # the commonest new term of the best passage
    assert facet_queries(SECOND, best, sent=[SECOND.upper()], n=2) == queries[1:]
    assert facet_queries(SECOND, best, sent=[], n=1) == [SECOND]


def test_links_are_followed_only_when_their_anchor_or_path_shares_a_facet_word() -> None:
    links = [PageLink(url="https://site.example/tides", text="Tide tables"),
             PageLink(url="https://site.example/x", text="The great storm beacon"),
             PageLink(url="https://site.example/lamps-storm", text="More")]  # fmt: skip
    page = make_page(links=links)
    assert pick_links([page], [SECOND], seen=set(), limit=5) == [
        "https://site.example/x", "https://site.example/lamps-storm"]  # fmt: skip
    assert pick_links([page], [SECOND], seen={"https://site.example/x"}, limit=5) == [
        "https://site.example/lamps-storm"]  # fmt: skip
    assert pick_links([page], [SECOND], seen=set(), limit=1) == ["https://site.example/x"]


def test_a_round_plans_queries_and_links_only_for_the_facets_that_need_one() -> None:
    storm = PageLink(url="https://site.example/storm", text="The great storm")
    page = make_page(url="https://site.example/a", links=[storm])
    bundle = _bundle(["The Velmora harbour lighthouse was built in 1871."])
    facets = [FacetCheck(FIRST, "supported", [0]), FacetCheck(SECOND, "missing", [])]
    plan = plan_round(bundle, facets, {page.content_sha256: page}, sent=[f"{FIRST} {SECOND}"],
                      fetched={page.url}, queries_per_facet=2, links=2)  # fmt: skip
    assert plan.facets == [SECOND] and plan.queries[0] == SECOND
    assert all("Velmora" not in q for q in plan.queries)
    assert plan.links == ["https://site.example/storm"]  # the best page's, though not its facet's
    done = plan_round(bundle, [FacetCheck(FIRST, "supported", [0])], {}, sent=[], fetched=set(),
                      queries_per_facet=2, links=2)  # fmt: skip
    assert (done.facets, done.queries, done.links) == ([], [], [])


def test_each_bound_stops_the_rounds_and_names_itself() -> None:
    deep = DeepSettings(max_rounds=2, max_pages=6, max_tokens=1000, max_seconds=10)
    need = [FacetCheck(SECOND, "weak", [])]
    room = Spent(rounds=1, last_pages=3, pages=0, tokens=0, seconds=1.0)
    assert stop_reason(deep, room, need) == ""
    assert stop_reason(deep, room, []) == "sufficient"
    cases = {
        "max_rounds": Spent(rounds=3, last_pages=3, pages=3, tokens=0, seconds=1.0),
        "nothing_new": Spent(rounds=2, last_pages=0, pages=0, tokens=0, seconds=1.0),
        "max_pages": Spent(rounds=2, last_pages=6, pages=6, tokens=0, seconds=1.0),
        "max_tokens": Spent(rounds=1, last_pages=3, pages=0, tokens=1000, seconds=1.0),
        "max_seconds": Spent(rounds=1, last_pages=3, pages=0, tokens=0, seconds=10.0),
    }
    for reason, spent in cases.items():
        assert stop_reason(deep, spent, need) == reason
    assert stop_reason(DeepSettings(max_rounds=0), room, need) == "max_rounds"


def test_same_site_links_are_absolute_visible_on_host_and_each_once() -> None:
    tree = fromstring(
        "<html><body><a href='/b#top'>Boats</a><a href='b'>again</a>"
        "<a href='https://www.site.example/c'>C</a><a href='http://other.example/d'>D</a>"
        "<a href='mailto:x@site.example'>mail</a><a href='#frag'>here</a>"
        "<a href='https://site.example/a'>self</a><a href='http://[::1'>bad</a></body></html>"
    )
    links = same_site_links(tree, "https://site.example/a")
    assert [(link.url, link.text) for link in links] == [
        ("https://site.example/b", "Boats"), ("https://www.site.example/c", "C")]  # fmt: skip
