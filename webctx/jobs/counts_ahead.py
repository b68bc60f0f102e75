"""A job's chunks' counts of its question's words, counted as each page is embedded, for
the BM25 half of its rank (`webctx.stages.sparse.bm25_scores`).

Rank fuses cosine with BM25 over every candidate, and counting their words was most of
a 20-source job's rank: ~90 ms of regex over ~2,500 chunks after the last page had
arrived. Each page's chunks are counted instead while its embed task has them, most of
them while other pages are still downloading; rank counts only what it does not find.

Kept in the process that embedded: a rank task in another process (broker mode, several
workers) counts every candidate itself, as before. Bounded by the texts held (a job's
entry goes when its rank takes it, the oldest jobs' when the bound is reached).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from webctx.stages.sparse import TermCounts, query_terms, term_counts

MAX_TEXTS = 20_000
"""Chunk texts held at most, over all jobs (about six 20-source jobs; ~20 MB of text)."""


@dataclass
class _Job:
    terms: frozenset[str]
    counts: dict[str, TermCounts] = field(default_factory=dict)


class CountsAhead:
    """Term counts of jobs' chunk texts, by job."""

    def __init__(self, *, max_texts: int = MAX_TEXTS) -> None:
        self._max_texts = max_texts
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def count(self, job_id: str, texts: Sequence[str], question: Callable[[], str]) -> None:
        """Count the job's question's words in `texts` (`question` is asked only for a job
        not seen yet)."""
        with self._lock:
            job = self._jobs.get(job_id)
        terms = job.terms if job is not None else query_terms(question())
        counted = {text: term_counts(text, terms) for text in texts}  # outside the lock
        with self._lock:
            job = self._jobs.setdefault(job_id, _Job(terms))
            self._jobs.move_to_end(job_id)
            before = len(job.counts)
            job.counts.update(counted)
            self._held += len(job.counts) - before
            while self._held > self._max_texts and len(self._jobs) > 1:
                _, oldest = self._jobs.popitem(last=False)
                self._held -= len(oldest.counts)

    def take(self, job_id: str) -> dict[str, TermCounts]:
        """The job's counts (chunk text -> its `TermCounts`), no longer held here; {} when
        none were counted in this process."""
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is None:
                return {}
            self._held -= len(job.counts)
            return job.counts

    @property
    def held(self) -> int:
        """Chunk texts held, over all jobs."""
        return self._held
