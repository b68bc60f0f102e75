"""What a `depth=deep` job's next round looks for: which facets of the question need one,
the queries for each, and the same-site links of the best pages worth following.

Plain functions of the first round's bundle and pages; the job engine runs the round
(webctx/jobs/rounds.py) and the QA benchmark (bench/deep.py) calls the same functions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol
from urllib.parse import unquote, urlsplit

from webctx.deep_settings import DeepSettings
from webctx.models import Bundle, Page
from webctx.stages.words import keywords as content_words

Status = Literal["supported", "weak", "missing"]
NEEDS_ROUND: frozenset[str] = frozenset({"weak", "missing"})
TERMS_PER_QUERY = 3
"""Terms of a facet's best passages added to its second query."""
_WORDS = re.compile(r"\w+", re.UNICODE)


class Facet(Protocol):
    """A facet of the question with how well the bundle covers it (a `FacetCoverage`)."""

    @property
    def text(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def chunks(self) -> list[int]: ...


@dataclass(frozen=True)
class FacetCheck:
    """A facet as the lexical check reads it: its text, status and best chunks (indices
    into the bundle's chunks, best first)."""

    text: str
    status: Status
    chunks: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RoundPlan:
    """What one further round asks for: the facets it is for, its queries and links."""

    facets: list[str]
    queries: list[str]
    links: list[str]


def facets_needing_round(facets: Sequence[Facet]) -> list[Facet]:
    """The facets a further round should look for: weak or missing ones, in order."""
    return [f for f in facets if f.status in NEEDS_ROUND]


def check_facets(bundle: Bundle, facets: Sequence[str]) -> list[FacetCheck]:
    """A lexical stand-in for the bundle's facet coverage: a facet is supported when one
    chunk holds half its content words, weak from a quarter, missing below."""
    texts = [_word_set(c.text) for c in bundle.chunks]
    out = []
    for facet in facets:
        terms = {w.casefold() for w in content_words(facet)}
        shares = [len(terms & t) / len(terms) if terms else 0.0 for t in texts]
        order = sorted(range(len(shares)), key=lambda i: -shares[i])
        best = shares[order[0]] if order else 0.0
        status: Status = "supported" if best >= 0.5 else "weak" if best >= 0.25 else "missing"
        out.append(FacetCheck(facet, status, [i for i in order[:3] if shares[i] > 0]))
    return out


def facet_queries(
    facet: str, best_texts: Sequence[str], *, sent: Sequence[str], n: int
) -> list[str]:
    """Up to `n` queries for one facet, none already `sent` (case-insensitive): the facet
    alone, then its content words with the commonest new terms of its best passages."""
    words = content_words(facet)
    known = {w.casefold() for w in words}
    counts: Counter[str] = Counter()
    for text in best_texts:
        counts.update(w for w in content_words(text) if w.casefold() not in known)
    terms = [t for t, _ in counts.most_common(TERMS_PER_QUERY)]
    candidates = [" ".join(facet.split()), " ".join([*words, *terms])]
    seen = {q.casefold() for q in sent}
    out = []
    for query in candidates:
        if query and query.casefold() not in seen:
            seen.add(query.casefold())
            out.append(query)
    return out[:n]


def pick_links(
    pages: Sequence[Page], facets: Sequence[str], *, seen: set[str], limit: int
) -> list[str]:
    """Up to `limit` same-site links of `pages` (best first) whose anchor text or path
    shares a content word with a facet; the most shared first, then page order; none in
    `seen`."""
    terms = {w.casefold() for f in facets for w in content_words(f)}
    scored: list[tuple[int, int, str]] = []
    taken: set[str] = set()
    for page in pages:
        for link in page.links:
            if link.url in seen or link.url in taken:
                continue
            words = _word_set(link.text) | _word_set(unquote(urlsplit(link.url).path))
            shared = len(terms & words)
            if shared:
                taken.add(link.url)
                scored.append((-shared, len(scored), link.url))
    return [url for _, _, url in sorted(scored)[:limit]]


def best_texts(bundle: Bundle, chunks: Sequence[int]) -> list[str]:
    """The texts of the bundle's chunks `chunks` (indices; out-of-range ones skipped)."""
    return [bundle.chunks[i].text for i in chunks if 0 <= i < len(bundle.chunks)]


def best_pages(bundle: Bundle, chunks: Sequence[int], pages: dict[str, Page]) -> list[Page]:
    """The pages of the bundle's chunks `chunks`, then of its other chunks, each once."""
    order = [*chunks, *range(len(bundle.chunks))]
    by_id = {s.id: s.content_sha256 for s in bundle.sources}
    out: dict[str, Page] = {}
    for i in order:
        if 0 <= i < len(bundle.chunks):
            sha = by_id.get(bundle.chunks[i].source)
            if sha in pages and sha not in out:
                out[sha] = pages[sha]
    return list(out.values())


def plan_round(
    bundle: Bundle,
    facets: Sequence[Facet],
    pages: dict[str, Page],
    *,
    sent: Sequence[str],
    fetched: set[str],
    queries_per_facet: int,
    links: int,
) -> RoundPlan:
    """The next round for the facets that need one (an empty plan: none does)."""
    needed = facets_needing_round(facets)
    queries: list[str] = []
    for facet in needed:
        texts = best_texts(bundle, facet.chunks)
        queries += facet_queries(facet.text, texts, sent=[*sent, *queries], n=queries_per_facet)
    chunks = [i for f in needed for i in f.chunks]
    texts = [f.text for f in needed]
    followed = pick_links(best_pages(bundle, chunks, pages), texts, seen=fetched, limit=links)
    return RoundPlan([f.text for f in needed], queries, followed if needed else [])


@dataclass(frozen=True)
class Spent:
    """What a deep job has used so far, against its bounds."""

    rounds: int
    """Rounds run, the first included."""
    last_pages: int
    """New pages the last round chose (the first round: its sources)."""
    pages: int
    """New pages of every further round."""
    tokens: int
    """Tokens embedded for the job."""
    seconds: float
    """The job's age."""


def stop_reason(deep: DeepSettings, spent: Spent, needed: Sequence[Facet]) -> str:
    """Why no further round should start ("" when one may), checked in this order:
    `sufficient` (no facet weak or missing), `max_rounds`, `nothing_new` (the last round
    found no new page), `max_pages`, `max_tokens`, `max_seconds`."""
    if not needed:
        return "sufficient"
    if spent.rounds > deep.max_rounds:
        return "max_rounds"
    if spent.rounds > 1 and spent.last_pages == 0:
        return "nothing_new"
    if spent.pages >= deep.max_pages:
        return "max_pages"
    if spent.tokens >= deep.max_tokens:
        return "max_tokens"
    if spent.seconds >= deep.max_seconds:
        return "max_seconds"
    return ""


def _word_set(text: str) -> set[str]:
    return {w.casefold() for w in _WORDS.findall(text)}
