"""Batch research at scale on the loopback QA web (`bench/qa_web.py`'s pages and questions):
throughput by worker count, cost per question as a batch grows, an interactive job's
latency during a batch, and worker memory over a batch.

    python bench/batch_scaling.py [--questions 200] [--sizes 50,100,200] [--workers 1,2,4]
                                  [--no-embedded] [--write]

The web: every page of ../shared/data/qa served with a fixed delay drawn from 0.2–1 s, a
SearxNG-compatible BM25 search over them, an OpenAI-compatible embeddings endpoint with
0.2 s latency per request. Its vectors are lexical (feature hashing): this measures
throughput and shared work, not answer quality, and keeps the 2 CPU cores for the
pipeline (bench/answer_recall.py measures quality with MiniLM).

Broker mode uses the machine's Redis (db 14, or $WEBCTX_BENCH_REDIS_URL), flushed before
each run, so every run starts with cold caches. "N workers" is N `webctx worker -Q
search,fetch,embed` processes plus one `-Q store,rank` process: the embedded Qdrant engine
admits one process per path (with a Qdrant server the store side scales the same way).
Each batch may keep THREADS items per search/fetch/embed process in flight, THREADS being
every worker's -c (1, or $WEBCTX_BENCH_THREADS). One thread per process keeps 4 workers
within 2 cores, so the run measures how throughput scales while the work waits on the web
and the provider; at 2 or 8 threads per process 4 workers need more CPU than 2 cores have
(docs/benchmarks.md gives those runs too). The embedded default runs with its default
threads and batch concurrency. CPU seconds per question are read from /proc for each
role, and for this process (the loopback web), so a run on a machine too small for the
work shows where the CPU went.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import write_section  # noqa: E402
from bench.batch_report import Run, report, throughput_table  # noqa: E402
from bench.batch_workers import Workers  # noqa: E402
from bench.qa_web import Question, data_dir, load_qa, render_html  # noqa: E402
from webctx.adapters.hash_embedder import HashEmbedder  # noqa: E402
from webctx.devweb.embeddings import make_embeddings_app  # noqa: E402
from webctx.devweb.searxng import SearchDoc, make_searxng_app  # noqa: E402
from webctx.devweb.server import LoopbackServer  # noqa: E402
from webctx.devweb.site import SitePage, make_site_app  # noqa: E402

REDIS_URL = os.environ.get("WEBCTX_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
MODEL = "hash-embedding"
EMBED_LATENCY_S = 0.2
SEED = 0
THREADS = int(os.environ.get("WEBCTX_BENCH_THREADS", "1"))


@dataclass
class Web:
    """The three loopback servers and the site's request counter."""

    site: LoopbackServer
    search: LoopbackServer
    embeddings: LoopbackServer
    hits: collections.Counter[str]

    def env(self) -> dict[str, str]:
        """Settings pointing webctx at this web."""
        return {
            "WEBCTX_SEARCH_PROVIDER": "searxng",
            "WEBCTX_SEARXNG_URL": self.search.url,
            "OPENAI_BASE_URL": self.embeddings.url + "/v1",
            "OPENAI_API_KEY": "bench",
            "WEBCTX_EMBEDDING_MODEL": MODEL,
            "WEBCTX_ALLOWED_NETWORKS": "127.0.0.1/32",
            "WEBCTX_FETCH__PER_HOST_DELAY_S": "0",  # our own loopback site
        }

    def downloads(self) -> int:
        """Page requests the site answered (robots.txt excluded)."""
        return sum(n for path, n in self.hits.items() if path != "/robots.txt")

    def stop(self) -> None:
        """Stop the servers."""
        for server in (self.site, self.search, self.embeddings):
            server.stop()


def _delay(path: str) -> float:
    """A fixed per-page delay in 0.2–1 s (stable across runs)."""
    return 0.2 + 0.8 * (int(hashlib.sha256(path.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF)


def start_web() -> tuple[Web, list[Question]]:
    """The QA pages with delays, search over them, slow embeddings; and the questions."""
    loaded = load_qa(data_dir() / "qa")
    if loaded is None:
        raise SystemExit(f"no QA data under {data_dir() / 'qa'} (set WEBCTX_BENCH_DATA)")
    docs, questions = loaded
    # queries.jsonl lists a page's questions together; a batch is a seeded sample, and the
    # 50/100/200-question batches are prefixes of the same order.
    random.Random(SEED).shuffle(questions)
    hits: collections.Counter[str] = collections.Counter()
    pages = {d.url_path: SitePage(body=render_html(d), delay_s=_delay(d.url_path)) for d in docs}
    site = LoopbackServer(make_site_app(pages, hits=hits)).start()
    search = LoopbackServer(
        make_searxng_app([SearchDoc(site.url + d.url_path, d.title, d.text) for d in docs])
    ).start()
    embed = HashEmbedder(model=MODEL).vectors
    embeddings = LoopbackServer(
        make_embeddings_app(embed, model=MODEL, rpm=None, tpm=None, latency_s=EMBED_LATENCY_S)
    ).start()
    return Web(site, search, embeddings, hits), questions


def _env(web: Web, qdrant: Path, *, inflight: int | None) -> dict[str, str]:
    """Settings for a run: broker mode with `inflight` items in flight and THREADS threads
    per worker, or (None) the embedded default with its default concurrency."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBCTX_", "CELERY_"))}
    env.update(web.env(), WEBCTX_QDRANT_PATH=str(qdrant), PYTHONPATH=str(ROOT))
    env["WEBCTX_DATA_DIR"] = f"{qdrant}-data"  # the embedded state server's files, not the user's
    env.update(WEBCTX_BATCH__TICK_S="2")
    if inflight is not None:
        env.update(WEBCTX_BATCH__CONCURRENCY=str(inflight),
                   WEBCTX_BATCH__MAX_INFLIGHT=str(inflight),
                   WEBCTX_WORKER_CONCURRENCY=str(THREADS), CELERY_BROKER_URL=REDIS_URL)  # fmt: skip
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "webctx.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, check=False)


def _questions_file(questions: list[Question], path: Path) -> Path:
    path.write_text(
        "".join(json.dumps({"id": q.id, "question": q.question}) + "\n" for q in questions)
    )
    return path


def _status(client: redis.Redis, batch_id: str) -> dict[str, object]:
    from webctx.jobs.batches import BatchStore
    from webctx.jobs.store import JobStore
    from webctx.settings import BatchSettings

    price = BatchSettings().price_per_1k_tokens
    store = BatchStore(client, JobStore(client))
    return store.status(batch_id, price_per_1k_tokens=price).as_dict()


def _latencies(client: redis.Redis, batch_id: str, n: int) -> list[float]:
    from webctx.jobs.batch_items import item_job_id
    from webctx.jobs.store import JobStore

    jobs, out = JobStore(client), []
    for i in range(n):
        job_id = item_job_id(batch_id, i)
        finished = jobs.finished_at(job_id)
        if finished is not None:
            out.append(finished - jobs.created_at(job_id))
    return out


def broker_run(
    web: Web,
    questions: list[Question],
    n: int,
    workers: int,
    tmp: Path,
    *,
    probe: bool = False,
) -> tuple[Run, dict[str, float]]:
    """A cold batch of `n` questions on `workers` search/fetch/embed processes; with `probe`,
    also interactive-job latency idle and mid-batch, and worker RSS at item 10 and n."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.flushdb()
    run_dir = Path(tempfile.mkdtemp(dir=tmp))
    env = _env(web, run_dir / "q", inflight=THREADS * workers)
    procs = Workers(env, workers, run_dir, threads=THREADS)
    extra: dict[str, float] = {}
    try:
        if probe:
            extra["idle_s"] = _interactive(env, questions[-1].question)
        before = web.downloads()
        cpu_before, web_cpu_before = procs.cpu_s(), time.process_time()
        file = _questions_file(questions[:n], run_dir / "q.jsonl")
        batch_id = _submit(env, file, f"b{n}-{workers}")
        quarter = None if not probe else (lambda: _interactive(env, questions[-2].question))
        status = _follow(client, batch_id, n, procs if probe else None, "", extra, quarter)
        cpu = {k: v - cpu_before[k] for k, v in procs.cpu_s().items()}
        cpu["web"] = time.process_time() - web_cpu_before  # the loopback servers (this process)
        downloads = web.downloads() - before
        if probe:
            # The same workers, a second batch of new questions over the now indexed web:
            # memory per item, without the index's growth of the cold batch.
            warm = _questions_file(questions[n : 2 * n], run_dir / "warm.jsonl")
            _follow(client, _submit(env, warm, f"warm{n}"), n, procs, "warm_", extra, None)
        run = Run(
            label=f"broker, {workers} worker{'s' if workers > 1 else ''}",
            n=n,
            elapsed_s=float(status["stats"]["elapsed_s"]),  # type: ignore[index]
            latencies=_latencies(client, batch_id, n),
            stats=dict(status["stats"]),  # type: ignore[call-overload]
            downloads=downloads,
            done=int(status["done"]),  # type: ignore[call-overload]
            failed=int(status["failed"]),  # type: ignore[call-overload]
            cpu_s=cpu,
        )
    finally:
        procs.stop()
        client.flushdb()
        client.close()
    return run, extra


def _submit(env: dict[str, str], file: Path, name: str) -> str:
    submitted = _cli(env, "batch", "submit", str(file), "--name", name)
    if submitted.returncode != 0:
        raise SystemExit(submitted.stderr[-3000:])
    return submitted.stdout.strip()


def _follow(
    client: redis.Redis,
    batch_id: str,
    n: int,
    procs: Workers | None,
    prefix: str,
    extra: dict[str, float],
    at_quarter: Callable[[], float] | None,
) -> dict[str, object]:
    """Poll the batch until it ends and return its status. With `procs`, worker memory
    at item 10, n/2 and the end goes into `extra` (keys `{prefix}rss10_…`); with
    `at_quarter`, its result at item n/4 goes into `extra["loaded_s"]`."""
    samples = {f"{prefix}rss10": 10, f"{prefix}rss_mid": n // 2}
    while True:
        status = _status(client, batch_id)
        ended = int(status["done"]) + int(status["failed"])  # type: ignore[call-overload]
        for key, item in samples.items():
            if procs is not None and ended >= item and f"{key}_io_mb" not in extra:
                extra.update({f"{key}_{k}_mb": v for k, v in procs.rss_mb().items()})
        if at_quarter is not None and ended >= n // 4 and "loaded_s" not in extra:
            extra["loaded_s"] = at_quarter()
        if status["state"] != "running" and not status["running"]:
            break
        time.sleep(0.5)
    if procs is not None:
        extra.update({f"{prefix}rss_end_{k}_mb": v for k, v in procs.rss_mb().items()})
    return status


def _interactive(env: dict[str, str], question: str) -> float:
    """Job latency (submission to bundle) of one research job."""
    done = _cli(env, "research", question, "--format", "json")
    if done.returncode != 0:
        raise SystemExit(f"interactive job failed: {done.stderr[-2000:]}")
    return float(json.loads(done.stdout)["stats"]["elapsed_s"])


def embedded_run(web: Web, questions: list[Question], n: int, tmp: Path) -> Run:
    """The same batch on the embedded default (`batch submit --wait`, no broker, default
    worker threads and batch concurrency)."""
    run_dir = Path(tempfile.mkdtemp(dir=tmp))
    env = _env(web, run_dir / "q", inflight=None)
    file = _questions_file(questions[:n], run_dir / "q.jsonl")
    before = web.downloads()
    out = run_dir / "results.jsonl"
    done = _cli(env, "batch", "submit", str(file), "--name", "emb", "--wait", "--out", str(out))
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    latencies = [r["bundle"]["stats"]["elapsed_s"] for r in records if "bundle" in r]
    return Run(
        "embedded default",
        n,
        float(summary["stats"]["elapsed_s"]),
        latencies,
        summary["stats"],
        web.downloads() - before,
        summary["done"],
        summary["failed"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--sizes", default="50,100,200")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--no-embedded", action="store_true")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    n = args.questions
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(w) for w in args.workers.split(",")]
    started = time.monotonic()
    web, questions = start_web()
    runs: list[Run] = []
    by_size: dict[int, Run] = {}
    probe: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in counts:
            run, extra = broker_run(web, questions, n, w, Path(tmp), probe=w == max(counts))
            runs.append(run)
            probe.update(extra)
            if w == max(counts):
                by_size[n] = run
            print(throughput_table(runs[-1:]), flush=True)
        if not args.no_embedded:
            runs.append(embedded_run(web, questions, n, Path(tmp)))
        for size in sizes:
            if size not in by_size:
                by_size[size] = broker_run(web, questions, size, max(counts), Path(tmp))[0]
    web.stop()
    total_s = time.monotonic() - started
    text = report(
        runs, by_size, probe, counts=counts, n=n, total_s=total_s, seed=SEED, threads=THREADS
    )
    print(text)
    if args.write:
        write_section("batch_scaling", text)


if __name__ == "__main__":
    main()
