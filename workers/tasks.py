"""The stage tasks of a job: thin wrappers that take ids, run the job engine's step for
them (`webctx.jobs.steps`, `webctx.jobs.pages`) and return an id. Acks, time limits and
retries are every task's policy (`webctx.workers.policy`); the steps record failures and
start the next stage through the engine's fan-in.
"""

from __future__ import annotations

from webctx.jobs import pages, steps
from webctx.workers import deferred
from webctx.workers.app import app, broker_priority, worker_deps
from webctx.workers.policy import StageTask


@app.task(name="webctx.plan")
def plan(job_id: str) -> str:
    """Turn the question into search queries and start one search per query."""
    steps.plan_job(worker_deps().engine, job_id)
    return job_id


@app.task(name="webctx.search", bind=True)
def search(self: StageTask, job_id: str, query_idx: int) -> str:
    """Run one query; the search that completes the set starts the fetches."""
    steps.search_one(worker_deps().engine, job_id, query_idx, retry=self.retry_transient)
    return job_id


@app.task(name="webctx.fetch")
def fetch(job_id: str, url_id: str) -> str:
    """Download and extract one page; hand it to the embed queue, or settle it."""
    pages.fetch_one(worker_deps().engine, job_id, url_id)
    return url_id


@app.task(name="webctx.render")
def render(job_id: str, url_id: str) -> str:
    """Render one script-filled page in the browser and extract it; on to embed, or settle."""
    pages.render_one(worker_deps().engine, job_id, url_id)
    return url_id


@app.task(name="webctx.embed", bind=True)
def embed(self: StageTask, job_id: str, url_id: str) -> str:
    """Chunk and embed one page and stage its vectors for the store task, or settle it."""
    pages.embed_one(worker_deps().engine, job_id, url_id, retry=self.retry_transient)
    return url_id


@app.task(name="webctx.store", bind=True)
def store(self: StageTask, job_id: str, url_id: str) -> str:
    """Write one page's staged chunks to the vector store (where it is open: `-Q store`)."""
    pages.store_one(worker_deps().engine, job_id, url_id, retry=self.retry_transient)
    return url_id


@app.task(name="webctx.embed_question")
def embed_question(job_id: str) -> str:
    """Embed the job's question into the embedding cache ahead of its rank task."""
    steps.embed_question(worker_deps().engine, job_id)
    return job_id


@app.task(name="webctx.rank", bind=True)
def rank(self: StageTask, job_id: str, force: bool = False) -> str:
    """Rank the job's chunks into a cited bundle; `force` is the deadline watchdog."""
    steps.rank_job(worker_deps().engine, job_id, force=force, retry=self.retry_transient)
    return job_id


@app.task(name="webctx.index_later", bind=True, priority=broker_priority(9))
def index_later(self: StageTask, job_id: str, url_id: str | None = None) -> str:
    """Embed and store every chunk of an answered job's pages, for the index, in turn and
    after this worker's interactive work (low priority); what is left after the turn's
    budget, later. (`url_id`: one page, as messages sent by earlier versions name.)"""
    with deferred.turn() as pause:
        done = pages.index_later(worker_deps().engine, job_id, [url_id] if url_id else None,
                                 retry=self.retry_transient, pause=pause)  # fmt: skip
    if not done:
        self.apply_async(args=(job_id,), countdown=deferred.RESEND_S)
    return job_id


@app.task(name="webctx.admission_tick")
def admission_tick() -> int:
    """Publish the held jobs of every tenant with free slots (webctx.jobs.admission)."""
    from webctx.jobs.admission import admission_caps
    from webctx.workers.app import publish_held

    deps = worker_deps()
    return len(deps.stores.jobs.admission.reconcile(admission_caps(deps.settings), publish_held))
