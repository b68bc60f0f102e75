"""How answer recall scores a bundle (bench/answer_recall.py): a question is a hit at a
budget when a normalised answer string occurs in the bundle's text; citations are checked
against the page's text and the HTML as served."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.qa_web import QAWeb, Question, normalize, visible_text
from webctx.models import Bundle, Failure, Page
from webctx.stages.bundle import validate_offsets

BUDGETS = (250, 500, 1000, 2000, 4000)


@dataclass
class Job:
    """A question with the pages the pipeline fetched for it."""

    question: Question
    queries: list[str]
    pages: list[Page]
    failures: list[Failure]
    qvec: np.ndarray | None = None


@dataclass
class Tally:
    """Hits per budget of one system, and the largest bundle seen per budget."""

    hits: dict[int, int] = field(default_factory=dict)
    over_budget: int = 0

    def add(self, budget: int, job: Job, texts: Sequence[str], tokens: int) -> None:
        self.hits[budget] = self.hits.get(budget, 0) + hit(job.question, texts)
        self.over_budget += tokens > budget


def hit(question: Question, texts: Sequence[str]) -> bool:
    """Whether any answer string occurs in the texts (normalised)."""
    bundle = normalize(" \n ".join(texts))
    return any(normalize(a) in bundle for a in question.answers)


@dataclass
class Citations:
    """Bundle chunks checked against their source text and the served HTML.

    `verbatim` compares with the page's text as served (tags removed, entities decoded),
    invisible format characters (U+200B, U+200E, U+FEFF...) included: extraction keeps them
    (webctx.stages.format_chars)."""

    web: QAWeb
    chunks: int = 0
    exact: int = 0
    verbatim: int = 0
    missing: list[str] = field(default_factory=list)
    _served: dict[str, str] = field(default_factory=dict)

    def __call__(self, job: Job, bundle: Bundle) -> None:
        pages = {p.content_sha256: p for p in job.pages}
        problems = validate_offsets(bundle, pages)
        by_id = {s.id: s for s in bundle.sources}
        self.chunks += len(bundle.chunks)
        self.exact += len(bundle.chunks) - len(problems)
        for chunk in bundle.chunks:
            url = by_id[chunk.source].final_url
            if url not in self._served:
                self._served[url] = visible_text(self.web.served.get(url, ""))
            seen = normalize(chunk.text) in self._served[url]
            self.verbatim += seen
            if not seen:
                self.missing.append(chunk.text)


def cells(tally: Tally, n: int) -> str:
    """A tally's hit rates, one table cell per budget."""
    return " | ".join(f"{tally.hits.get(b, 0) / n:.3f}" for b in BUDGETS)


def table(rows: dict[str, Tally], n: int, ceiling: float | None) -> str:
    """Systems by budget: hit rates, bundles over budget, the ceiling row."""
    head = "| system | " + " | ".join(f"{b} tok" for b in BUDGETS) + " | over budget |"
    lines = [head, "|---|" + "---:|" * (len(BUDGETS) + 1)]
    for name, tally in rows.items():
        lines.append(f"| {name} | {cells(tally, n)} | {tally.over_budget} |")
    if ceiling is not None:
        lines.append("| ceiling (answer in fetched pages) | " + " | ".join(
            f"{ceiling:.3f}" for _ in BUDGETS) + " | |")  # fmt: skip
    return "\n".join(lines)
