"""The hand-offs between a job's stages: which task starts the next stage, and only once.

    plan ─► search × queries ─► (last search) choose URLs ─► fetch × URLs ─► embed × pages
         ─► store × pages ─► (last page settled) rank ─► bundle
    a one-off job (the lexical first pass): fetch × URLs ─► embed ahead × pages but the
         last (likely chunks, into the embedding cache) ─► (last page settled) rank
         ─► bundle ─► index_later (its pages in turn, low priority, after interactive work)
    a script-filled page: fetch ─► render ─► embed (its fetch completes when render ends)
      └──► embed_question (the question's vector into the embedding cache, ahead of rank)

No chords: on a Redis result backend a chord's body runs only when every header result
arrives, so one lost message would leave the job waiting until its watchdog. Each fan-in
is a completion set in the job store (`JobStore.complete`): the task whose completion
fills it starts the next stage, and a redelivered task that finds the set full but the
next stage not recorded as started starts it again (every task is idempotent, so a
duplicate start costs work, never correctness).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from webctx.jobs.round_store import RoundRecord
from webctx.jobs.store import JobStore, url_id_for
from webctx.models import Bundle, BundleStats, Failure, JobStatus
from webctx.stages.bundle import build_bundle
from webctx.stages.search import merge_results

Start = Callable[[str, Sequence[tuple[str | int, ...]]], None]
"""Send one task of a stage ("search", "fetch", "embed"…) per argument tuple (the worker
layer's; tasks carry ids only)."""


class FanIn:
    """Starts each stage of a job's tasks when its fan-in completes."""

    def __init__(
        self, jobs: JobStore, start: Start, *, warm: Callable[[Sequence[str]], None] | None = None
    ) -> None:
        self.jobs = jobs
        self.start = start
        self.warm = warm
        """Readies the fetches of URLs about to be fetched (their hosts' robots.txt)."""

    def planned(self, job_id: str, *, queries: int, question_ahead: bool) -> None:
        """The queries are planned: one search each, and the question's embedding ahead
        of rank (when the vectors are cached: rank then reads it instead of waiting)."""
        if question_ahead:
            self.start("embed_question", [(job_id,)])
        self.start("search", [(job_id, i) for i in range(queries)])

    def searched(self, job_id: str, query_idx: int) -> None:
        """One query is done; the last one chooses the URLs and starts their fetches."""
        total = len(self.jobs.queries(job_id))
        if self.jobs.complete(job_id, "search", str(query_idx), total=total):
            self._fetch_chosen(job_id)

    def _fetch_chosen(self, job_id: str) -> None:
        """Merge every query's results, keep the best `max_sources`, fetch each (a deep
        job's further round: its own new URLs, `fetch_round`)."""
        request = self.jobs.request(job_id)
        if request.depth == "deep":
            latest = self.jobs.rounds.latest(job_id)
            if latest is not None and latest.round > 1:
                self.fetch_round(job_id, latest)
                return
        merged = merge_results(
            self.jobs.search_results(job_id),
            include_domains=request.include_domains,
            exclude_domains=request.exclude_domains,
        )
        chosen = [r.url for r in merged[: request.max_sources]]
        if chosen and self.warm is not None:
            self.warm(chosen)  # while the fetch tasks are sent and start
        if not chosen:
            error = _no_results_error(self.jobs.failures(job_id))
            # Like a job whose every page failed: a bundle listing why, then the status.
            self.jobs.save_bundle(job_id, failure_bundle(self.jobs, job_id))
            self.jobs.set_status(job_id, JobStatus.FAILED, error=error)
            return
        url_ids = self.jobs.set_urls(job_id, chosen)
        self.jobs.set_count(job_id, "results", len(merged))
        self.start("fetch", [(job_id, url_id) for url_id in url_ids])
        self.jobs.mark_next_started(job_id, "search")

    def fetch_round(self, job_id: str, record: RoundRecord) -> None:
        """Choose a further round's new URLs (its queries' results, then its links; none
        the job has, at most its allowance) and fetch them; with none, rank again (the
        round ends with nothing new). Chosen once: a redelivered search fetches the same."""
        jobs = self.jobs
        if not record.chosen:
            request = jobs.request(job_id)
            merged = merge_results(jobs.search_results(job_id)[record.queries_from :],
                                   include_domains=request.include_domains,
                                   exclude_domains=request.exclude_domains)  # fmt: skip
            have = set(jobs.urls(job_id).values())
            record.links = [u for u in record.links if u not in have]
            room = max(0, record.page_allowance - len(record.links))
            found = [r.url for r in merged if r.url not in have and r.url not in record.links]
            record.chosen = [*found[:room], *record.links] or ["-"]
            jobs.rounds.save(job_id, record)
        chosen = [u for u in record.chosen if u != "-"]
        jobs.rounds.add_urls(job_id, chosen, url_id_for)  # a redelivery adds none
        if record.pages != len(chosen):
            record.pages = len(chosen)
            jobs.rounds.save(job_id, record)
        if not chosen:
            self.start("rank", [(job_id,)])
            jobs.mark_next_started(job_id, "embed")
            return
        if self.warm is not None:
            self.warm(chosen)
        self.start("fetch", [(job_id, url_id_for(u)) for u in chosen])
        jobs.mark_next_started(job_id, "search")

    def fetched(self, job_id: str, url_id: str) -> None:
        """One URL's fetch is done (for progress: each page then moves on by itself)."""
        self.jobs.complete(job_id, "fetch", url_id, total=len(self.jobs.urls(job_id)))

    def to_render(self, job_id: str, url_id: str) -> None:
        """Render one script-filled page in a browser; its fetch completes when that ends."""
        self.start("render", [(job_id, url_id)])

    def to_embed(self, job_id: str, url_id: str) -> None:
        """Chunk and embed one fetched page."""
        self.start("embed", [(job_id, url_id)])

    def to_store(self, job_id: str, url_id: str) -> None:
        """Write one embedded page's staged chunks to the vector store."""
        self.start("store", [(job_id, url_id)])

    def index_later(self, job_id: str) -> None:
        """Index the answered job's pages (every chunk, for the index): the lexical first
        pass embedded only the chunks the ranker could reach. One task for them all, a
        page at a time, so that it can make way for interactive work between pages."""
        self.start("index_later", [(job_id,)])

    def settled(self, job_id: str, url_id: str) -> None:
        """One page is settled (stored, nothing to store, or failed); the last one starts
        rank."""
        if self.jobs.complete(job_id, "embed", url_id, total=len(self.jobs.urls(job_id))):
            self.start("rank", [(job_id,)])
            self.jobs.mark_next_started(job_id, "embed")


def failure_bundle(jobs: JobStore, job_id: str) -> Bundle:
    """The bundle of a job that ends without a page: no sources, its recorded failures."""
    failures = jobs.failures(job_id)
    queries = jobs.queries(job_id)
    stats = BundleStats(queries=len(queries), failed=len(failures))
    return build_bundle(job_id=job_id, question=jobs.request(job_id).question, queries=queries,
                        pages={}, ranked=[], failures=failures, stats=stats)  # fmt: skip


def _no_results_error(failures: Sequence[Failure]) -> str:
    if failures:
        reasons = "; ".join(f"{f.url}: {f.error}" for f in failures[:5])
        return f"search failed for every query: {reasons}"
    return "search returned no results"
