"""The further rounds of a `depth=deep` job, in the job engine.

    ... ─► (last page settled) rank ─► bundle: a facet weak or missing, bounds hold?
        yes ─► round n + 1: search × new queries ─► (last search) new results + same-site
               links of the best pages ─► fetch × new URLs ─► embed/store ─► rank again
        no  ─► the bundle, with each round's counts (`stats.rounds`)

A round reuses the job's stages and tasks: its queries are appended to the job's (the
search tasks take their index), its URLs to the job's chosen ones (the fetch tasks, and so
the fetch guard, take their id), and the completion sets count them with the rest. Rank
decides: it holds the bundle the decision reads, and a job that stops deepening keeps that
bundle, ranked once more for nothing. A `fast` job never reaches this module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from webctx.deep_settings import DeepSettings
from webctx.jobs.engine import Engine
from webctx.jobs.round_store import RoundRecord
from webctx.jobs.store import JobStore
from webctx.models import Bundle, RoundStats
from webctx.stages.deepen import (
    Facet,
    Spent,
    check_facets,
    facets_needing_round,
    plan_round,
    stop_reason,
)
from webctx.stages.facets import split_facets

logger = logging.getLogger(__name__)


def bundle_facets(bundle: Bundle) -> list[Facet]:
    """The bundle's facets and how well it covers each: its coverage, or for a bundle
    without one the lexical check of `webctx.stages.deepen`."""
    if bundle.coverage is not None:
        return list(bundle.coverage.facets)
    return list(check_facets(bundle, split_facets(bundle.question)))


def deepen(engine: Engine, job_id: str, bundle: Bundle, *, force: bool = False) -> bool:
    """End the job's current round and start the next when a facet needs one and the
    bounds allow; True when a round was started (rank runs again after it), False when the
    bundle stands (its `stats.rounds` set here). `force` (the deadline): no further round."""
    jobs, deep = engine.jobs, engine.settings.deep
    facets = bundle_facets(bundle)
    records = _end_round(engine, job_id, facets)
    current = records[-1]
    stop = "deadline" if force else _stop_reason(deep, engine, job_id, records, facets)
    plan = None
    if not stop:
        pages = jobs.pages(job_id)
        plan = plan_round(bundle, facets, pages, sent=jobs.queries(job_id),
                          fetched=set(jobs.urls(job_id).values()),
                          queries_per_facet=deep.queries_per_facet,
                          links=deep.links_per_round)  # fmt: skip
        stop = "" if plan.queries or plan.links else "nothing_new"
    if stop or plan is None:
        current.stopped = stop
        jobs.rounds.save(job_id, current)
        bundle.stats.rounds = [_stats(r) for r in records]
        logger.info("deep job stops", extra={"job_id": job_id, "rounds": len(records),
                                             "reason": stop})  # fmt: skip
        return False
    return _begin_round(engine, job_id, current, plan.facets, plan.queries, plan.links)


def _begin_round(
    engine: Engine,
    job_id: str,
    before: RoundRecord,
    facets: list[str],
    queries: list[str],
    links: list[str],
) -> bool:
    jobs, deep = engine.jobs, engine.settings.deep
    sent = jobs.queries(job_id)
    spent = sum(r.pages for r in jobs.rounds.records(job_id) if r.round > 1)
    allowance = min(deep.pages_per_round, deep.max_pages - spent)
    record = RoundRecord(round=before.round + 1, started_at=time.time(),
                         queries_from=len(sent), queries=queries,
                         links=links[:allowance], facets=facets, page_allowance=allowance,
                         chunks_before=jobs.counters(job_id).get("chunks", 0))  # fmt: skip
    if not jobs.rounds.begin(job_id, record):
        return True  # a redelivered rank: the round runs already
    jobs.rounds.restart_fanins(job_id)
    facts = {"job_id": job_id, "round": record.round, "queries": len(queries), "links": len(links)}
    logger.info("deep round begins", extra=facts)
    if not queries:
        engine.fanin.fetch_round(job_id, record)
        return True
    jobs.set_queries(job_id, [*sent, *queries])
    engine.fanin.start("search", [(job_id, i) for i in range(len(sent), len(sent) + len(queries))])
    return True


def round_query_limit(jobs: JobStore, job_id: str, query_idx: int, deep: DeepSettings) -> int:
    """Results to ask of a query that a further round sent (0: a first-round query)."""
    latest = jobs.rounds.latest(job_id)
    if latest is None or query_idx < min(r.queries_from for r in jobs.rounds.records(job_id)):
        return 0
    return deep.results_per_query


def _end_round(engine: Engine, job_id: str, facets: Sequence[Facet]) -> list[RoundRecord]:
    """Every round's record, the current one ended now (its counts and what it left)."""
    jobs = engine.jobs
    records = jobs.rounds.records(job_id)
    if not records:  # round 1: the job's ordinary plan, search and fetch
        first = RoundRecord(round=1, started_at=jobs.created_at(job_id),
                            queries=jobs.queries(job_id), facets=[jobs.request(job_id).question],
                            pages=len(jobs.urls(job_id)))  # fmt: skip
        jobs.rounds.begin(job_id, first)
        records = [first]
    current = records[-1]
    if current.seconds <= 0:
        chunks = jobs.counters(job_id).get("chunks", 0)
        current.new_chunks = max(0, chunks - current.chunks_before)
        current.seconds = round(max(0.001, time.time() - current.started_at), 3)
        current.missing = [f.text for f in facets_needing_round(facets)]
        jobs.rounds.save(job_id, current)
    return records


def _stop_reason(
    deep: DeepSettings,
    engine: Engine,
    job_id: str,
    records: Sequence[RoundRecord],
    facets: Sequence[Facet],
) -> str:
    """Why no further round should start ("" when one may): `stop_reason` of what the
    job has spent."""
    jobs = engine.jobs
    spent = Spent(rounds=len(records), last_pages=records[-1].pages,
                  pages=sum(r.pages for r in records if r.round > 1),
                  tokens=jobs.counters(job_id).get("tokens_embedded", 0),
                  seconds=time.time() - jobs.created_at(job_id))  # fmt: skip
    return stop_reason(deep, spent, facets_needing_round(facets))


def _stats(record: RoundRecord) -> RoundStats:
    return RoundStats(round=record.round, queries=len(record.queries), pages=record.pages,
                      links=len(record.links), new_chunks=record.new_chunks,
                      seconds=record.seconds, facets=record.facets, missing=record.missing,
                      stopped=record.stopped)  # fmt: skip
