"""A job's chunks' BM25 term counts, counted as its pages are embedded and read by its
rank: the same bundle as counting at rank, and a bounded memory."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import redis_url
from tests.factories import make_page
from webctx.jobs import pages, steps
from webctx.jobs.counts_ahead import CountsAhead
from webctx.models import JobRequest, JobStatus
from webctx.settings import Settings
from webctx.stages.sparse import query_terms, term_counts
from webctx.workers.deps import build_deps

QUESTION = "When did the glacier retreat from the valley?"
TEXTS = [
    "\n\n".join(f"The harbour record {i} notes ships, tides, the valley road." for i in range(60))
    + "\n\nThe glacier began to retreat from the valley in 1850.",
    "\n\n".join(f"Ledger {i}: the glacier was measured again each summer." for i in range(60)),
]


def _no_retry(exc: Exception) -> None:
    raise AssertionError(f"no retry expected: {exc}")


def test_rank_reads_the_counts_its_embeds_made_and_answers_as_counting_itself(
    tmp_path: Path, redis_client: object
) -> None:
    started: list[tuple[str, list[tuple[str | int, ...]]]] = []
    settings = Settings(embedding_provider="hash", qdrant_path=tmp_path / "q",
                        broker_url=redis_url(), redis_url=redis_url())  # fmt: skip
    deps = build_deps(settings, start=lambda stage, args: started.append((stage, list(args))))
    engine = deps.engine
    try:
        bundles = []
        for run in ("counted ahead", "counted at rank"):
            job_id = deps.jobs.create(JobRequest(question=QUESTION, top_k=5, token_budget=400))
            urls = [f"https://example.org/{n}" for n in range(len(TEXTS))]
            for url_id, url, text in zip(deps.jobs.set_urls(job_id, urls), urls, TEXTS,
                                         strict=True):  # fmt: skip
                deps.jobs.save_page(job_id, url_id, make_page(url=url, text=text))
                pages.embed_one(engine, job_id, url_id, retry=_no_retry)
                pages.store_one(engine, job_id, url_id, retry=_no_retry)
            engine.flush_writes()  # durable: the pages are marked stored
            held = engine.counts_ahead.held
            if run == "counted ahead":  # every chunk of both pages, for this job's terms
                assert held > len(TEXTS)
            else:  # the pages were stored already: nothing embedded, nothing counted
                assert held == 0
            steps.rank_job(engine, job_id, force=False, retry=_no_retry)
            assert deps.jobs.status(job_id) is JobStatus.SUCCEEDED
            assert engine.counts_ahead.held == 0  # rank took them
            bundle = deps.jobs.bundle(job_id)
            assert bundle is not None
            bundles.append([(c.text, c.score) for c in bundle.chunks])
        assert bundles[0] == bundles[1]
        assert "1850" in bundles[0][0][0]
    finally:
        deps.close()


def test_counts_are_the_questions_terms_and_the_question_is_read_once_per_job() -> None:
    asked: list[str] = []

    def question() -> str:
        asked.append("asked")
        return QUESTION

    ahead = CountsAhead()
    ahead.count("job", TEXTS[:1], question)
    ahead.count("job", TEXTS[1:], question)
    assert asked == ["asked"]
    terms = query_terms(QUESTION)
    assert ahead.take("job") == {t: term_counts(t, terms) for t in TEXTS}
    assert ahead.take("job") == {} and ahead.held == 0


def test_the_oldest_jobs_counts_go_when_the_bound_is_reached() -> None:
    ahead = CountsAhead(max_texts=5)
    ahead.count("old", ["a b", "c d", "e f"], lambda: "a c")
    ahead.count("new", ["g h", "i j"], lambda: "g")
    assert ahead.held == 5
    ahead.count("new", ["k l"], lambda: "g")  # over the bound: the old job goes
    assert ahead.take("old") == {}
    assert set(ahead.take("new")) == {"g h", "i j", "k l"}
    ahead.count("alone", [f"w{i}" for i in range(8)], lambda: "w1")  # one job over the bound
    assert len(ahead.take("alone")) == 8  # kept: its own rank needs it
