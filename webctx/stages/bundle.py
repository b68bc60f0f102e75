"""Assemble ranked chunks into a cited bundle, render it as Markdown, and check its offsets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC

from webctx.models import (
    Bundle,
    BundleChunk,
    BundleSource,
    BundleStats,
    Failure,
    Page,
    Retrieval,
    ScoredChunk,
)
from webctx.stages.instructions import fence_untrusted, flag_note, new_nonce, text_flags
from webctx.stages.pdf import pages_of

_MAX_FAILURES_SHOWN = 10


def build_bundle(
    *,
    job_id: str,
    question: str,
    queries: Sequence[str],
    pages: Mapping[str, Page],
    ranked: Sequence[ScoredChunk],
    failures: Sequence[Failure],
    stats: BundleStats,
    retrievals: Mapping[str, Retrieval] | None = None,
) -> Bundle:
    """Number sources by first appearance among the score-ordered chunks and cite them;
    `retrievals` (by content hash) say how the job got each page."""
    retrievals = retrievals or {}
    failures = list(failures)
    sources: dict[str, BundleSource] = {}
    chunks: list[BundleChunk] = []
    # Stable sort: equal scores keep the ranker's order.
    for scored in sorted(ranked, key=lambda c: -c.score):
        page = pages.get(scored.chunk.content_sha256)
        if page is None:
            # A chunk we cannot cite must not be quoted; record it rather than fail the job.
            failures.append(
                Failure(url=scored.url, stage="rank", error="page missing", reason="missing_page")
            )
            continue
        source = sources.get(page.content_sha256) or _source(
            len(sources) + 1, page, retrievals.get(page.content_sha256)
        )
        sources[page.content_sha256] = source
        chunks.append(_bundle_chunk(source.id, scored, page.page_starts))
    bundle_tokens = sum(c.tokens for c in chunks)
    flagged = sum(1 for c in chunks if c.flags)
    return Bundle(
        job_id=job_id,
        question=question,
        queries=list(queries),
        sources=list(sources.values()),
        chunks=chunks,
        failures=failures,
        stats=stats.model_copy(update={"bundle_tokens": bundle_tokens, "flagged_chunks": flagged}),
    )


def _source(number: int, page: Page, how: Retrieval | None) -> BundleSource:
    return BundleSource(
        id=number,
        url=page.url,
        final_url=page.final_url,
        title=page.title,
        site=page.site,
        published=page.published,
        fetched_at=page.fetched_at,
        content_sha256=page.content_sha256,
        author=page.author,
        language=page.language,
        retrieved=how.retrieved if how else None,
        checked_at=how.checked_at if how else None,
        stale=how.stale if how else False,
        stale_reason=how.stale_reason if how else None,
        flags=text_flags(page.title, page.site, page.author),
        opt_out=page.opt_out,
    )


def _bundle_chunk(source: int, scored: ScoredChunk, page_starts: list[int] | None) -> BundleChunk:
    chunk = scored.chunk
    return BundleChunk(
        source=source,
        text=chunk.text,
        start=chunk.start,
        end=chunk.end,
        tokens=chunk.tokens,
        score=scored.score,
        flags=text_flags(chunk.text),
        pages=pages_of(page_starts, chunk.start, chunk.end) if page_starts else None,
    )


def render_markdown(bundle: Bundle, *, nonce: str | None = None) -> str:
    """The bundle as Markdown: quoted chunks with [n] markers, then sources and failures.

    Passages and sources (page text, titles included) sit in one block fenced by a fresh
    `nonce` (`instructions.fence_untrusted`); flagged passages and titles say so.
    """
    lines: list[str] = []
    for chunk in bundle.chunks:
        lines.append(f"**[{_citation(chunk)}]** · score {chunk.score:.3f}{flag_note(chunk.flags)}")
        lines.extend(f"> {line}".rstrip() for line in chunk.text.splitlines())
        lines.append("")
    lines += ["## Sources", ""]
    lines.extend(_source_line(source) for source in bundle.sources)
    quoted = fence_untrusted("\n".join(lines), nonce=nonce or new_nonce())
    lines = [f"# {_one_line(bundle.question)}", "", *_coverage_lines(bundle), quoted.rstrip()]
    if bundle.stats.flagged_chunks:
        lines.append(f"\n{bundle.stats.flagged_chunks} passage(s) flagged `instructions`.")
    if bundle.failures:
        lines += ["", f"## Not included ({len(bundle.failures)})", ""]
        lines.extend(
            f"- {f.url} — {f.stage}: {f.reason}" for f in bundle.failures[:_MAX_FAILURES_SHOWN]
        )
        if len(bundle.failures) > _MAX_FAILURES_SHOWN:
            lines.append(f"- … and {len(bundle.failures) - _MAX_FAILURES_SHOWN} more")
    return "\n".join(lines) + "\n"


def _coverage_lines(bundle: Bundle) -> list[str]:
    """What the bundle covers, before its passages: each missing facet said plainly, and
    of several facets each one's status and the sources of its passages."""
    coverage = bundle.coverage
    if coverage is None:
        return []
    verdict = "sufficient" if coverage.sufficient else "insufficient"
    lines = [f"Coverage: {verdict} (confidence {coverage.confidence:.2f})"]
    if len(coverage.facets) > 1:
        for facet in coverage.facets:
            cited = dict.fromkeys(bundle.chunks[i].source for i in facet.chunks
                                  if i < len(bundle.chunks))  # fmt: skip
            shown = ", ".join(f"[{n}]" for n in cited) or "none"
            lines.append(f"- {facet.status} ({facet.confidence:.2f}): "
                         f"{_one_line(facet.text)} — sources {shown}")  # fmt: skip
    lines += ["", *coverage.notes] if coverage.notes else []
    return [*lines, ""]


def _citation(chunk: BundleChunk) -> str:
    """`3`, or of a PDF `3, p. 12` / `3, pp. 12–13`."""
    if not chunk.pages:
        return str(chunk.source)
    first, last = chunk.pages[0], chunk.pages[-1]
    return f"{chunk.source}, p. {first}" if first == last else f"{chunk.source}, pp. {first}–{last}"


def _source_line(source: BundleSource) -> str:
    title = _one_line(source.title) or source.site or source.url
    when = (
        f"published {source.published}"
        if source.published
        else f"fetched {source.fetched_at.date().isoformat()}"
    )
    about = [_one_line(source.author) if source.author else "", source.language or "", when,
             _freshness_note(source)]  # fmt: skip
    if source.opt_out:  # opt-outs reported, not honoured: the reader sees the publisher's word
        about.append(f"publisher opted out: {_one_line(source.opt_out)} (reported, not honoured)")
    line = f"- [{source.id}] {title} — {source.url} ({'; '.join(a for a in about if a)})"
    return line + flag_note(source.flags)


def _freshness_note(source: BundleSource) -> str:
    """`live, checked 2026-05-01 10:02 UTC`; a stale copy says so, and why."""
    if source.retrieved is None:
        return ""
    note: str = source.retrieved
    if source.retrieved == "provider":
        note = "the search provider's copy: the download failed"
    if source.checked_at is not None:
        note += f", checked {source.checked_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    if source.stale:
        note += f", STALE: live fetch failed ({source.stale_reason or 'error'})"
    return note


def _one_line(text: str) -> str:
    return " ".join(text.split())


def validate_offsets(bundle: Bundle, pages: Mapping[str, Page]) -> list[str]:
    """Every way a bundle chunk breaks `text == page.text[start:end]`; empty when none do."""
    by_id = {source.id: source for source in bundle.sources}
    problems: list[str] = []
    for n, chunk in enumerate(bundle.chunks):
        source = by_id.get(chunk.source)
        if source is None:
            problems.append(f"chunk {n}: cites unknown source [{chunk.source}]")
            continue
        page = pages.get(source.content_sha256)
        if page is None:
            problems.append(f"chunk {n}: page of source [{chunk.source}] is missing")
        elif not 0 <= chunk.start <= chunk.end <= len(page.text):
            problems.append(f"chunk {n}: offsets {chunk.start}:{chunk.end} out of range")
        elif page.text[chunk.start : chunk.end] != chunk.text:
            problems.append(f"chunk {n}: text differs from page text at {chunk.start}:{chunk.end}")
    return problems
