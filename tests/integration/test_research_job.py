"""A research job end to end: real Celery workers, real Redis, the Qdrant engine, the
openai client, trafilatura and httpx, against the loopback test web."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.testweb import HOSTILE, PDF_PATH, PDF_TITLE, TRAP_QUESTION, LoopbackWeb
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.adapters.pdf_sandbox import PdfLimits, SandboxedPdfReader
from webctx.models import Bundle, BundleStats, Download
from webctx.stages.bundle import render_markdown
from webctx.stages.fetch import extract_page
from webctx.stages.pdf import pages_of

QUESTION = "how do lithium-ion batteries degrade?"
PDF_READER = SandboxedPdfReader(PdfLimits())


def _assert_grounded(bundle: Bundle, web: LoopbackWeb) -> None:
    """Every source is on the test web and every chunk sits at its offsets in the page."""
    assert bundle.schema_version == 1
    assert bundle.chunks, "bundle has no chunks"
    assert sum(c.tokens for c in bundle.chunks) <= 1500
    ids = {s.id for s in bundle.sources}
    assert ids == set(range(1, len(bundle.sources) + 1))
    for source in bundle.sources:
        assert source.url.startswith(web.site.url)
        resp = httpx.get(source.final_url, timeout=10)
        assert resp.status_code == 200
        page = extract_page(
            Download(
                url=source.url,
                final_url=source.final_url,
                status=200,
                content_type=resp.headers["content-type"],
                body=resp.content,
            ),
            pdf=PDF_READER,
        )
        assert page.content_sha256 == source.content_sha256
        for chunk in (c for c in bundle.chunks if c.source == source.id):
            assert page.text[chunk.start : chunk.end] == chunk.text
            assert chunk.text in page.text
    assert [c.score for c in bundle.chunks] == sorted(
        (c.score for c in bundle.chunks), reverse=True
    )


def _assert_failures_recorded(bundle: Bundle, web: LoopbackWeb) -> None:
    failed = {f.url.removeprefix(web.site.url): f for f in bundle.failures}
    for path in HOSTILE:
        assert path in failed, f"{path} not reported as failed: {sorted(failed)}"
    assert failed["/trap/missing.html"].reason == "http_status"
    assert failed["/trap/huge.html"].reason == "too_large"
    assert failed["/trap/slow.html"].reason == "timeout"
    assert failed["/trap/report.pdf"].reason == "malformed"
    assert failed["/trap/locked.pdf"].reason == "encrypted"
    assert failed["/trap/scan.pdf"].reason == "no_text_layer"
    assert failed["/trap/bomb.pdf"].reason == "too_large"
    assert failed["/trap/scan.pdf"].stage == "extract"
    assert bundle.stats.failed >= len(HOSTILE)


def _assert_pdf_cited_with_pages(bundle: Bundle, web: LoopbackWeb) -> None:
    """The PDF report is a source; its chunks name their pages, which hold their text."""
    cited = [s for s in bundle.sources if s.url == web.site.url + PDF_PATH]
    assert len(cited) == 1, ([f for f in bundle.failures if f.url.endswith(".pdf")],
                             [s.url for s in bundle.sources])  # fmt: skip
    [source] = cited
    assert source.title == PDF_TITLE and source.author == "Ada Volta"
    assert source.published == "2024-03-15"
    body = httpx.get(source.final_url, timeout=10).content
    download = Download(url=source.url, final_url=source.final_url, status=200,
                        content_type="application/pdf", body=body)  # fmt: skip
    page = extract_page(download, pdf=PDF_READER)
    assert page.page_starts is not None and len(page.page_starts) >= 3
    chunks = [c for c in bundle.chunks if c.source == source.id]
    assert chunks
    for chunk in chunks:
        assert page.text[chunk.start : chunk.end] == chunk.text
        assert chunk.pages == pages_of(page.page_starts, chunk.start, chunk.end)
        first, last = chunk.pages
        assert page.page_starts[first - 1] <= chunk.start
        cited = "p. " + str(first) if first == last else f"pp. {first}–{last}"
        assert f"**[{source.id}, {cited}]**" in render_markdown(bundle)


def _shown_bundle(env: dict[str, str], job_id: str, fmt: str) -> str:
    """`webctx bundle JOB --format fmt` once the job has a bundle (waits up to 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        shown = run_cli(env, "bundle", job_id, "--format", fmt)
        if shown.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_research_embedded_default_returns_grounded_bundle(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"))
    done = run_cli(
        env,
        "research",
        QUESTION,
        "--format",
        "json",
        "--max-sources",
        "20",
        "--top-k",
        "10",
        "--token-budget",
        "1500",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Bundle.model_validate_json(done.stdout)
    _assert_grounded(bundle, test_web)
    _assert_failures_recorded(bundle, test_web)
    _assert_pdf_cited_with_pages(bundle, test_web)
    assert bundle.stats.fetched >= 10
    assert bundle.stats.embed_requests >= 1 and bundle.stats.tokens_embedded > 0
    assert "fetched" in done.stderr  # progress lines on a non-TTY stderr


@pytest.mark.slow
def test_research_broker_mode_runs_on_separate_worker_processes(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(
        **test_web.env(),
        CELERY_BROKER_URL=redis_url(),
        WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"),
    )
    # Search/fetch/embed and store/rank on different processes: only the latter opens the
    # vector store.
    start_worker(env, "-Q", "search,fetch,embed", "-n", "io@%h")
    start_worker(env, "-Q", "store,rank", "-n", "vec@%h")
    done = run_cli(
        env,
        "research",
        QUESTION,
        "--format",
        "json",
        "--max-sources",
        "20",
        "--top-k",
        "10",
        "--token-budget",
        "1500",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Bundle.model_validate_json(done.stdout)
    _assert_grounded(bundle, test_web)
    _assert_failures_recorded(bundle, test_web)
    _assert_pdf_cited_with_pages(bundle, test_web)


def test_research_no_wait_prints_job_id_then_bundle_is_retrievable(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(
        **test_web.env(), CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q")
    )
    start_worker(env)
    done = run_cli(env, "research", QUESTION, "--no-wait", "--max-sources", "12")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert len(job_id) == 32

    shown = _shown_bundle(env, job_id, "markdown")
    assert "[1]" in shown and QUESTION in shown


def test_job_whose_sources_all_fail_ends_failed_with_failures_listed(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"))
    started = time.monotonic()
    done = run_cli(env, "research", TRAP_QUESTION, "--max-sources", "10")
    assert done.returncode == 1
    assert time.monotonic() - started < 60
    bundle = Bundle.model_validate_json(done.stdout)
    assert bundle.chunks == [] and bundle.sources == []
    assert {f.url.removeprefix(test_web.site.url) for f in bundle.failures} == set(HOSTILE)
    assert f"all {len(HOSTILE)} sources failed" in done.stderr
    assert bundle.coverage is not None and bundle.coverage.sufficient is False
    assert bundle.coverage.notes == [f"No source found for: {TRAP_QUESTION}"]


def test_invalid_request_is_refused_before_anything_runs(tmp_path: Path) -> None:
    env = clean_env(WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"))
    done = run_cli(env, "research", "   ", "--max-sources", "0")
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "error: invalid request: question must contain text; max_sources must be between"
        " 1 and 100 (got 0)"
    ), done.stderr
    assert done.stdout == ""  # no job id: nothing submitted (the local service may start)


@pytest.mark.slow
def test_status_reports_progress_counts_in_broker_mode(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(
        **test_web.env(), CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q")
    )
    start_worker(env)
    job_id = run_cli(env, "research", QUESTION, "--no-wait", "--max-sources", "8").stdout.strip()
    waited = run_cli(env, "research", QUESTION, "--max-sources", "8")  # a second job, waited on
    assert waited.returncode == 0, waited.stderr[-2000:]
    status = json.loads(run_cli(env, "status", job_id).stdout)
    assert status["status"] == "succeeded"
    assert status["urls"] == 8 and status["fetched"] + status["failed"] >= 8


@pytest.mark.slow
def test_second_run_of_a_job_embeds_nothing_in_broker_mode(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(**test_web.env(), CELERY_BROKER_URL=redis_url())

    def research(store: str) -> BundleStats:
        done = run_cli({**env, "WEBCTX_QDRANT_PATH": str(tmp_path / store)}, "research",
                       QUESTION, "--max-sources", "8")  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return Bundle.model_validate_json(done.stdout).stats

    worker = start_worker({**env, "WEBCTX_QDRANT_PATH": str(tmp_path / "a")})
    first = research("a")
    worker.stop()
    start_worker({**env, "WEBCTX_QDRANT_PATH": str(tmp_path / "b")})
    # Another store: every chunk is stored again, its vector from the embedding cache.
    second = research("b")
    assert first.tokens_embedded > 0
    assert second.tokens_embedded == 0 and second.embed_requests == 0
    assert second.cache_hits == first.chunks + 1  # every chunk and the question
    assert second.tokens_saved == first.tokens_embedded
    # The same store: the pages are known to be stored, so nothing is chunked or looked up.
    third = research("b")
    assert third.chunks == first.chunks and third.cache_hits == 1
    assert third.tokens_embedded == 0 and third.embed_requests == 0


@pytest.mark.slow
def test_rerunning_embed_of_a_page_adds_no_point(test_web: LoopbackWeb, tmp_path: Path) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"))
    first = run_cli(env, "research", QUESTION, "--max-sources", "6")
    assert first.returncode == 0, first.stderr[-3000:]
    run_cli(env, "service", "stop")  # it holds the store
    store = EdgeVectorStore(tmp_path / "qdrant")
    before = store.count()
    store.close()
    assert before > 0
    # The same job again re-embeds and re-upserts every page: ids are content-derived.
    second = run_cli(env, "research", QUESTION, "--max-sources", "6")
    assert second.returncode == 0, second.stderr[-3000:]
    run_cli(env, "service", "stop")
    store = EdgeVectorStore(tmp_path / "qdrant")
    assert store.count() == before
    store.close()


@pytest.mark.slow
def test_embed_task_retried_after_provider_errors_completes_without_duplicates(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    clean = run_cli(
        clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "clean")),
        "research",
        QUESTION,
        "--max-sources",
        "6",
    )
    assert clean.returncode == 0, clean.stderr[-3000:]
    # The local service runs with its starter's settings: the next run starts its own.
    run_cli(clean_env(), "service", "stop")
    # One attempt per request inside the task, so each 500 becomes a Celery retry.
    test_web.embeddings_control.fail_next(3, status=500)
    flaky = run_cli(
        clean_env(
            **test_web.env(),
            WEBCTX_QDRANT_PATH=str(tmp_path / "flaky"),
            WEBCTX_EMBED__MAX_ATTEMPTS="1",
        ),
        "research",
        QUESTION,
        "--max-sources",
        "6",
    )
    assert flaky.returncode == 0, flaky.stderr[-3000:]
    run_cli(clean_env(), "service", "stop")
    counts = []
    for name in ("clean", "flaky"):
        store = EdgeVectorStore(tmp_path / name)
        counts.append(store.count())
        store.close()
    assert counts[0] == counts[1] > 0
    a, b = (Bundle.model_validate_json(x.stdout) for x in (clean, flaky))
    assert [c.text for c in a.chunks] == [c.text for c in b.chunks]


@pytest.mark.slow
def test_a_store_task_whose_staged_chunks_were_lost_embeds_the_page_again(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(
        **test_web.env(), CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q")
    )
    start_worker(env, "-Q", "search,fetch,embed", "-n", "io@%h")
    done = run_cli(env, "research", QUESTION, "--no-wait", "--max-sources", "12",
                   "--token-budget", "1500")  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()

    # No store worker yet: every page ends either settled (failed) or staged with its
    # store task waiting in the `store` queue.
    def waiting() -> int:
        urls = redis_client.hlen(f"webctx:job:{job_id}:urls") or 0
        settled = redis_client.scard(f"webctx:job:{job_id}:done:embed")
        queued = redis_client.llen("store")
        return queued if urls and settled + queued == urls else 0

    deadline = time.monotonic() + 60
    while not waiting() and time.monotonic() < deadline:
        time.sleep(0.2)
    queued = waiting()
    assert queued > 0, "no store task queued"
    staged = redis_client.keys("webctx:staged:*")
    assert 0 < len(staged) <= queued  # two URLs of one text share an entry
    redis_client.delete(*staged)  # lost: expired, or Redis lost them

    vec = start_worker(env, "-Q", "store,rank", "-n", "vec@%h")
    bundle = Bundle.model_validate_json(_shown_bundle(env, job_id, "json"))
    _assert_grounded(bundle, test_web)
    assert len(staged) <= vec.log.read_text().count("staged chunks missing") <= queued
    assert redis_client.keys("webctx:staged:*") == []  # stored, then dropped


def test_workers_that_count_tokens_load_the_tokenizer_at_start(
    tmp_path: Path, start_worker
) -> None:
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    fetching = start_worker(env, "-Q", "search,fetch", "-n", "sf@%h")
    storing = start_worker(env, "-Q", "store,rank", "-n", "vr@%h")
    # Loaded before "ready.", not by the first task that needs it.
    ready = storing.log.read_text()
    assert "tokenizer loaded" in ready.split("ready.")[0]
    assert "tokenizer loaded" not in fetching.log.read_text()


@pytest.mark.slow
def test_a_wiped_store_is_filled_again_not_trusted_to_hold_its_pages(
    test_web: LoopbackWeb, tmp_path: Path, start_worker
) -> None:
    store = tmp_path / "q"
    env = clean_env(**test_web.env(), CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(store))

    def research() -> Bundle:
        done = run_cli(env, "research", QUESTION, "--max-sources", "8")
        assert done.returncode == 0, done.stderr[-2000:]
        return Bundle.model_validate_json(done.stdout)

    worker = start_worker(env)
    first = research()
    worker.stop()
    shutil.rmtree(store)  # the user starts the vector store afresh; Redis keeps its marks
    worker = start_worker(env)
    second = research()
    worker.stop()
    assert first.chunks and first.stats.chunks > 0
    # Every page is stored again (from the embedding cache), and the bundle is as full.
    assert second.stats.chunks == first.stats.chunks
    assert second.stats.cache_hits == first.stats.chunks + 1  # every chunk and the question
    assert [c.text for c in second.chunks] == [c.text for c in first.chunks]
    reopened = EdgeVectorStore(store)
    assert reopened.count() >= first.stats.chunks
    reopened.close()


def test_a_worker_sets_its_allocator_to_return_freed_memory_at_start(
    tmp_path: Path, start_worker
) -> None:
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    storing = start_worker(env, "-Q", "store,rank", "-n", "mem@%h")
    before_ready = storing.log.read_text().split("ready.")[0]
    assert "allocator set to return freed memory" in before_ready
    assert "MALLOC_MMAP_THRESHOLD_" in before_ready


def test_a_worker_is_ready_without_a_second_of_mingle(tmp_path: Path, start_worker) -> None:
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    worker = start_worker(env, "-Q", "search,fetch", "-n", "quick@%h")
    before_ready = worker.log.read_text().split("ready.")[0]
    assert "mingle" not in before_ready  # no second spent asking for neighbours
