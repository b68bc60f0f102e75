"""build_bundle, render_markdown, validate_offsets: citations, rendering, round trip."""

from __future__ import annotations

from tests.factories import make_page, make_scored, one_hot
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.models import Bundle, BundleStats, Failure, Page, ScoredChunk
from webctx.stages.bundle import build_bundle, render_markdown, validate_offsets
from webctx.stages.chunk import chunk_page
from webctx.stages.rank import rank_chunks

_A = make_page(
    url="https://a.example/x", title="Alpha", published="2024-05-01", text="A one. A two."
)
_B = make_page(url="https://b.example/y", title="Beta", text="B one. B two.")
_C = make_page(url="https://c.example/z", title="", site="c.example", text="C one.")
_PAGES = {p.content_sha256: p for p in (_A, _B, _C)}


def _scored(page: Page, start: int, end: int, score: float) -> ScoredChunk:
    return make_scored(page=page, start=start, end=end, score=score, vector=one_hot(start))


def _bundle(ranked: list[ScoredChunk], failures: list[Failure] | None = None) -> Bundle:
    return build_bundle(
        job_id="job-1",
        question="How does Celery use Redis?",
        queries=["celery redis"],
        pages=_PAGES,
        ranked=ranked,
        failures=failures or [],
        stats=BundleStats(queries=1),
    )


def test_sources_are_numbered_by_first_appearance_in_score_order() -> None:
    ranked = [_scored(_A, 0, 6, 0.5), _scored(_B, 0, 6, 0.9), _scored(_A, 7, 13, 0.7)]
    bundle = _bundle(ranked)
    assert [(s.id, s.url) for s in bundle.sources] == [(1, _B.url), (2, _A.url)]
    assert [(c.source, c.text, c.score) for c in bundle.chunks] == [
        (1, "B one.", 0.9),
        (2, "A two.", 0.7),
        (2, "A one.", 0.5),
    ]


def test_pages_without_a_chunk_are_not_listed() -> None:
    bundle = _bundle([_scored(_C, 0, 6, 0.4)])
    assert [s.content_sha256 for s in bundle.sources] == [_C.content_sha256]


def test_bundle_tokens_are_summed_into_a_copy_of_the_stats() -> None:
    stats = BundleStats(queries=1)
    ranked = [_scored(_A, 0, 6, 0.5), _scored(_B, 0, 6, 0.9)]
    bundle = build_bundle(
        job_id="j",
        question="q",
        queries=[],
        pages=_PAGES,
        ranked=ranked,
        failures=[],
        stats=stats,
    )
    assert bundle.stats.bundle_tokens == sum(s.chunk.tokens for s in ranked) > 0
    assert bundle.stats.queries == 1 and stats.bundle_tokens == 0


def test_chunk_of_unknown_page_is_reported_not_cited() -> None:
    stray = make_scored("Stray text.", url="https://gone.example", score=0.99)
    bundle = _bundle([stray, _scored(_A, 0, 6, 0.5)])
    assert [c.source for c in bundle.chunks] == [1]
    assert [(f.url, f.reason) for f in bundle.failures] == [
        ("https://gone.example", "missing_page")
    ]


def test_markdown_has_citation_markers_and_a_sources_list() -> None:
    bundle = _bundle([_scored(_B, 0, 6, 0.9), _scored(_A, 0, 6, 0.5), _scored(_C, 0, 6, 0.1)])
    md = render_markdown(bundle)
    assert md.startswith("# How does Celery use Redis?\n")
    assert "**[1]** · score 0.900\n> B one." in md
    assert "**[2]** · score 0.500\n> A one." in md
    sources = md.split("## Sources", 1)[1]
    assert "- [1] Beta — https://b.example/y (fetched 2025-01-02)" in sources
    assert "- [2] Alpha — https://a.example/x (published 2024-05-01)" in sources
    assert "- [3] c.example — https://c.example/z" in sources
    assert "Not included" not in md


def test_markdown_summarises_failures_briefly() -> None:
    failures = [
        Failure(url=f"https://f{i}.example", stage="fetch", error="boom", reason="timeout")
        for i in range(12)
    ]
    md = render_markdown(_bundle([_scored(_A, 0, 6, 0.5)], failures))
    assert "## Not included (12)" in md
    assert "- https://f0.example — fetch: timeout" in md
    assert "- … and 2 more" in md and "https://f11.example" not in md


def test_bundle_json_round_trips() -> None:
    bundle = _bundle(
        [_scored(_A, 0, 6, 0.5), _scored(_B, 7, 13, 0.9)],
        [Failure(url="https://x.example", stage="fetch", error="e", reason="blocked")],
    )
    assert Bundle.model_validate_json(bundle.model_dump_json()) == bundle


def test_validate_offsets_reports_text_that_is_not_the_page_slice() -> None:
    bundle = _bundle([_scored(_A, 0, 6, 0.5), _scored(_B, 7, 13, 0.9)])
    assert validate_offsets(bundle, _PAGES) == []
    bundle.chunks[0].text = "B tw0."
    bundle.chunks[1].end = 999
    problems = validate_offsets(bundle, _PAGES)
    assert len(problems) == 2 and "differs" in problems[0] and "out of range" in problems[1]
    assert "missing" in validate_offsets(bundle, {})[0]


def test_chunked_ranked_bundle_keeps_offsets_exact() -> None:
    pages = [
        make_page(
            url=f"https://{n}.example", text=f"Intro {n}.\r\n\r\n  " + "Redis and Celery. " * 80
        )
        for n in range(3)
    ]
    embedder = HashEmbedder()
    question = embedder.embed_one("celery redis")
    candidates = [
        ScoredChunk(
            chunk=c, url=p.url, score=sum(a * b for a, b in zip(v, question, strict=True)), vector=v
        )
        for p in pages
        for c in chunk_page(p, max_tokens=64, overlap_tokens=16)
        for v in [embedder.embed_one(c.text)]
    ]
    ranked = rank_chunks(candidates, top_k=8, token_budget=300)
    by_sha = {p.content_sha256: p for p in pages}
    bundle = build_bundle(
        job_id="j",
        question="q",
        queries=["q"],
        pages=by_sha,
        ranked=ranked,
        failures=[],
        stats=BundleStats(),
    )
    assert bundle.chunks and validate_offsets(bundle, by_sha) == []
    assert bundle.stats.bundle_tokens <= 300
