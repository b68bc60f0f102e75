"""A job's steps: what each task does for a job, given the engine (`webctx.jobs.engine`)
and, where a provider may refuse for a while, the task's retry.

Each step checks that the job is still active, calls its stages, saves what they give in
the job store and hands on to the next stage through the fan-in. The steps of one page
(fetch, embed, store) are in `webctx.jobs.pages`.
"""

from __future__ import annotations

import logging
import time

import redis

from webctx.errors import ProviderDown, TransientError, WebctxError
from webctx.jobs.engine import Engine, Judge, Retry
from webctx.jobs.rounds import deepen, round_query_limit
from webctx.models import Bundle, BundleStats, Failure, JobStatus, Page, SearchResult
from webctx.stages.bundle import build_bundle
from webctx.stages.compose import answer_prefiltered, answer_question
from webctx.stages.coverage import assess_coverage
from webctx.stages.embed import embed_with_cache
from webctx.stages.facets import split_facets
from webctx.stages.judge import mark_skipped
from webctx.stages.search_chain import Attempt, ChainFailed, answer_query, tagged_answer

logger = logging.getLogger(__name__)


def plan_job(engine: Engine, job_id: str) -> None:
    """Turn the question into search queries (once) and start one search per query."""
    jobs = engine.jobs
    if not jobs.is_active(job_id):
        return
    down = known_down(engine)
    if down is not None:  # a provider the job needs is known to be down: fail now
        provider_down(engine, job_id, down)
        return
    jobs.set_status(job_id, JobStatus.RUNNING)
    jobs.mark_stage(job_id, "plan", start=True)
    queries = jobs.queries(job_id)
    if not queries:
        request = jobs.request(job_id)
        plan = engine.plan(request.question, request.max_queries)
        queries = plan.queries
        jobs.set_queries(job_id, queries, plan.facets)  # rank and coverage read these facets
    jobs.mark_stage(job_id, "plan", start=False)
    logger.info("job planned", extra={"job_id": job_id, "queries": len(queries)})
    engine.fanin.planned(job_id, queries=len(queries), question_ahead=engine.cache is not None)


def search_one(engine: Engine, job_id: str, query_idx: int, *, retry: Retry) -> None:
    """Run one planned query (a failure recorded, never raised past its retries); the
    last one starts the fetches."""
    jobs = engine.jobs
    if not jobs.is_active(job_id):
        return
    if not jobs.is_done(job_id, "search", str(query_idx)):
        jobs.mark_stage(job_id, "search", start=True)
        query = jobs.queries(job_id)[query_idx]
        # Each query alone should be able to fill the job's sources.
        request = jobs.request(job_id)
        limit = max(engine.settings.search_results_per_query, request.max_sources)
        if request.depth == "deep":  # a further round's query asks for more
            limit = max(limit, round_query_limit(jobs, job_id, query_idx, engine.settings.deep))
        try:
            results = _cached_search(engine, job_id, query_idx, query, limit)
        except ProviderDown as exc:
            provider_down(engine, job_id, exc)
            return
        except WebctxError as exc:
            if isinstance(exc, TransientError):
                retry(exc)
            results = []
            record_failure(engine, job_id, f"q:{query_idx}", f"query:{query}", "search", exc)
        jobs.save_search(job_id, query_idx, results)
        jobs.mark_stage(job_id, "search", start=False)
    engine.fanin.searched(job_id, query_idx)


def known_down(engine: Engine) -> ProviderDown | None:
    """The outage of a provider the job needs: the embeddings', or the search chain's when
    every member of it is down (a chain hands a query on past a dead member)."""
    searching = [b for b in engine.breakers if b.endpoint.role == "search"]
    others = [b for b in engine.breakers if b.endpoint.role != "search"]
    down = next((d for b in others if (d := b.down()) is not None), None)
    if down is not None or not searching:
        return down
    outages = [d for b in searching if (d := b.down()) is not None]
    if len(outages) < len(searching):
        return None
    if len(outages) == 1:
        return outages[0]
    return ProviderDown(engine.search.name, "every search provider is down: "
                        + "; ".join(map(str, outages)), url=outages[0].url)  # fmt: skip


def _count_attempts(engine: Engine, job_id: str, attempts: list[Attempt]) -> None:
    """Each provider's requests sent (answered or failed) and skips (its breaker was open),
    for the bundle's stats and the metrics (`search_<outcome>:<provider>`)."""
    counts: dict[str, int] = {}
    for a in attempts:
        names = [f"search_{a.outcome}:{a.provider}"]
        if a.outcome != "skipped":
            names.append(f"search_requests:{a.provider}")
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    if counts:
        engine.jobs.add_counts(job_id, **counts)


def _answered_by(engine: Engine, job_id: str, query_idx: int, provider: str) -> None:
    """Record which member of the chain answered query `query_idx` (1-based; 0: none)."""
    members = engine.search.name.split(",")
    position = members.index(provider) + 1 if provider in members else 0
    engine.jobs.set_count(job_id, f"query_provider:{query_idx}", position)


def _cached_search(
    engine: Engine, job_id: str, query_idx: int, query: str, limit: int
) -> list[SearchResult]:
    """One query's results, from the search cache when fresh (for the jobs that read the
    caches: `webctx.jobs.fetching.reads_caches`)."""
    jobs, cache = engine.jobs, engine.search_cache
    recency = jobs.request(job_id).recency_days
    # The cache holds unrestricted results only: a recency-limited query always goes out.
    cached = bool(jobs.batch_of(job_id) or engine.settings.embedded) and recency is None
    results = cache.get(query, limit=limit) if cached else None
    if results is not None:
        jobs.add_counts(job_id, searches_cached=1)
        _answered_by(engine, job_id, query_idx, results[0].provider if results else "")
        return results
    try:
        answer = answer_query(engine.search, query, limit=limit, recency_days=recency)
    except ChainFailed as failed:
        _count_attempts(engine, job_id, failed.attempts)
        raise failed.error from failed
    _count_attempts(engine, job_id, answer.attempts)
    _answered_by(engine, job_id, query_idx, answer.provider)
    results = tagged_answer(answer, query, limit=limit)
    if recency is None:
        cache.put(query, results, limit=limit)
    jobs.add_counts(job_id, searches_sent=1)
    return results


def embed_question(engine: Engine, job_id: str) -> None:
    """Embed the job's question into the embedding cache ahead of ranking, so the rank
    task (on the one process that holds the vector store) finds it instead of waiting on
    the provider. Best effort: on any failure the rank task embeds it itself."""
    jobs, cache = engine.jobs, engine.cache
    if cache is None or not jobs.is_active(job_id) or jobs.bundle(job_id) is not None:
        return
    embedding = engine.settings.embed
    try:
        outcome = embed_with_cache(
            [jobs.request(job_id).question],
            engine.embedder,
            cache=cache,
            limiter=engine.limiter,
            max_inputs=1,
            max_tokens_per_request=embedding.max_tokens_per_request,
            max_input_tokens=embedding.max_input_tokens,
            max_attempts=1,
        )
    except ProviderDown as exc:  # the job's pages would meet it too: fail now, not later
        provider_down(engine, job_id, exc)
        return
    except Exception as exc:  # noqa: BLE001 - the rank task embeds it and reports failures
        logger.info("question not embedded ahead", extra={"job_id": job_id, "error": str(exc)})
        return
    jobs.add_counts(
        job_id,
        embed_requests=outcome.requests,
        tokens_embedded=outcome.tokens,
        cache_hits=outcome.cache_hits,
        tokens_saved=outcome.tokens_saved,
        question_ahead=1,  # counted here: rank reads the vector without counting it again
    )


def _question_ahead(engine: Engine, job_id: str, question: str) -> list[float] | None:
    """The question's vector if `embed_question` embedded (and counted) it for this job."""
    if engine.cache is None or not engine.jobs.counters(job_id).get("question_ahead"):
        return None
    dimensions = getattr(engine.embedder, "dimensions", None)
    return engine.cache.get_many(engine.embedder.model, dimensions, [question])[0]


def rank_job(engine: Engine, job_id: str, *, force: bool, retry: Retry) -> None:
    """Rank the job's chunks into its cited bundle (once); `force` is the deadline
    watchdog. Any error but Redis's ends the job failed, after a transient one's retries."""
    jobs = engine.jobs
    if not jobs.is_active(job_id) or jobs.bundle(job_id) is not None:
        return
    if force:
        logger.warning("job deadline reached", extra={"job_id": job_id})
    jobs.mark_stage(job_id, "rank", start=True)
    request, pages = jobs.request(job_id), jobs.pages(job_id)
    failures, queries = jobs.failures(job_id), jobs.queries(job_id)
    facets = planned_facets(engine, job_id)
    stats = _stats(engine, job_id, pages_count=len(pages))
    if not pages:
        _finish_failed(engine, job_id, request.question, queries, failures, stats, force=force)
        return
    lexical_first = prefiltered(engine, job_id)
    try:
        if lexical_first:
            bundle = _answer_prefiltered(engine, job_id, queries, pages, failures, stats)
        else:
            bundle = answer_question(
                job_id=job_id, question=request.question, queries=queries, pages=pages,
                failures=failures, stats=stats, embedder=engine.embedder, store=engine.store,
                top_k=request.top_k, token_budget=request.token_budget,
                embedding=engine.settings.embed, cache=engine.cache, limiter=engine.limiter,
                question_vector=_question_ahead(engine, job_id, request.question),
                retrievals=jobs.retrievals(job_id), counted=engine.counts_ahead.take(job_id),
                facets=facets,
            )  # fmt: skip
    except ProviderDown as exc:
        provider_down(engine, job_id, exc)
        return
    except TransientError as exc:
        retry(exc)
        jobs.set_status(job_id, JobStatus.FAILED, error=f"rank: {exc}")
        return
    except redis.RedisError:
        raise  # the job store is down, not the job: redelivered once Redis is back
    except Exception as exc:  # noqa: BLE001 - a job must end, not wait for its watchdog
        logger.exception("rank failed", extra={"job_id": job_id})
        jobs.set_status(job_id, JobStatus.FAILED, error=f"rank: {exc or type(exc).__name__}")
        return
    if engine.judge is not None:
        _judge(engine.judge, bundle)
    if request.depth == "deep" and deepen(engine, job_id, bundle, force=force):
        return  # a further round runs; its last page ranks again
    jobs.mark_stage(job_id, "rank", start=False)
    bundle.stats.stage_s = jobs.stage_seconds(job_id)
    bundle.stats.elapsed_s = round(time.time() - jobs.created_at(job_id), 3)
    if jobs.save_bundle(job_id, bundle):
        jobs.set_status(job_id, JobStatus.SUCCEEDED)
        logger.info("job succeeded", extra={"job_id": job_id, "chunks": len(bundle.chunks)})
        # The pages' every chunk, for the index, after the answer: low-priority tasks on
        # the store queue. The embedded default runs them too, in the local service,
        # which outlives the command that asked (the command has its answer already).
        if lexical_first:
            engine.fanin.index_later(job_id)


def _judge(judge: Judge, bundle: Bundle) -> None:
    """The coverage judge on the bundle; whatever fails (even building its client), the
    numbers stand and the bundle says so."""
    try:
        judge(bundle)
    except Exception as exc:  # noqa: BLE001 - a judge is advice: the job goes on without it
        logger.warning("coverage judge failed", extra={"job_id": bundle.job_id, "exc": repr(exc)})
        mark_skipped(bundle, f"error: {type(exc).__name__}")


def planned_facets(engine: Engine, job_id: str) -> list[str]:
    """The facets the job's plan gave its question; a job planned before plans held facets
    gets the rules' (`split_facets`), as its plan would have."""
    facets = engine.jobs.queries(job_id, "facets")
    return facets or split_facets(engine.jobs.request(job_id).question)


def prefiltered(engine: Engine, job_id: str) -> bool:
    """True when the job's chunks go through the lexical first pass: its pages are not
    embedded as they arrive, rank embeds the chunks it can reach (`answer_prefiltered`) and
    the pages are indexed afterwards. Not for batch items: their pages are for the index."""
    when = engine.settings.prefilter.when
    local = getattr(engine.embedder, "in_process", False)
    if when == "never" or (when == "local" and not local):
        return False
    return engine.jobs.batch_of(job_id) is None


def _answer_prefiltered(
    engine: Engine,
    job_id: str,
    queries: list[str],
    pages: dict[str, Page],
    failures: list[Failure],
    stats: BundleStats,
) -> Bundle:
    """The bundle of a prefiltered job, from its pages and the question's vector."""
    request, settings = engine.jobs.request(job_id), engine.settings
    return answer_prefiltered(
        job_id=job_id, question=request.question, queries=queries, pages=pages,
        failures=failures, stats=stats, embedder=engine.embedder, top_k=request.top_k,
        token_budget=request.token_budget, chunking=settings.chunk, embedding=settings.embed,
        prefilter=settings.prefilter, cache=engine.cache, limiter=engine.limiter,
        question_vector=_question_ahead(engine, job_id, request.question),
        retrievals=engine.jobs.retrievals(job_id), facets=planned_facets(engine, job_id),
        chunks_per_s=getattr(engine.embedder, "chunks_per_s", None),
    )  # fmt: skip


def provider_down(engine: Engine, job_id: str, exc: ProviderDown) -> None:
    """End the job failed because a provider it needs is down: the outage's one line as
    its error, `provider_down` as its reason, and no failure of a page or query (they are
    not what failed). Its other tasks then find it finished and do nothing."""
    engine.jobs.set_status(job_id, JobStatus.FAILED, error=str(exc), reason=exc.reason)
    logger.warning("job failed: provider down", extra={"job_id": job_id, "url": exc.url,
                                                       "provider": exc.provider})  # fmt: skip


def record_failure(
    engine: Engine, job_id: str, key: str, url: str, stage: str, exc: Exception
) -> None:
    """Record why a source (or query, `key`) failed at `stage`; the job goes on."""
    reason = getattr(exc, "reason", type(exc).__name__)
    failure = Failure(url=url, stage=stage, error=str(exc) or type(exc).__name__, reason=reason)  # type: ignore[arg-type]
    engine.jobs.add_failure(job_id, key, failure)
    logger.info("source failed", extra={"job_id": job_id, "url": url, "stage": stage})


def _stats(engine: Engine, job_id: str, *, pages_count: int) -> BundleStats:
    jobs = engine.jobs
    counters, members = jobs.counters(job_id), engine.search.name.split(",")
    return BundleStats(
        queries=len(jobs.queries(job_id)),
        results=counters.get("results", 0),
        fetched=pages_count,
        failed=len(jobs.failures(job_id)),
        chunks=counters.get("chunks", 0),
        embed_requests=counters.get("embed_requests", 0),
        tokens_embedded=counters.get("tokens_embedded", 0),
        cache_hits=counters.get("cache_hits", 0),
        tokens_saved=counters.get("tokens_saved", 0),
        index_reused=counters.get("index_reused", 0),
        embedded_ahead=counters.get("embedded_ahead", 0),
        query_providers=[members[at - 1] if 0 < (at := counters.get(f"query_provider:{i}", 0))
                         <= len(members) else "" for i in range(len(jobs.queries(job_id)))],
        search_requests={name.split(":", 1)[1]: n for name, n in counters.items()
                         if name.startswith("search_requests:")},
        from_provider=counters.get("pages_from_provider", 0),
    )  # fmt: skip


def _finish_failed(
    engine: Engine,
    job_id: str,
    question: str,
    queries: list[str],
    failures: list[Failure],
    stats: BundleStats,
    *,
    force: bool,
) -> None:
    """End a job that has no page: a bundle listing the failures, and the reason."""
    bundle = build_bundle(job_id=job_id, question=question, queries=queries, pages={},
                          ranked=[], failures=failures, stats=stats)  # fmt: skip
    bundle.coverage = assess_coverage(planned_facets(engine, job_id), [])  # all missing
    engine.jobs.save_bundle(job_id, bundle)
    if force and not failures:
        error = "deadline reached before any source was fetched"
    else:
        error = f"all {len(failures)} sources failed: " + "; ".join(
            f"{f.url} ({f.stage}: {f.error})" for f in failures[:5]
        )
    engine.jobs.set_status(job_id, JobStatus.FAILED, error=error)
