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


class Workers:
    """N search/fetch/embed worker processes and one store/rank process."""

    def __init__(self, env: dict[str, str], n: int, logdir: Path) -> None:
        self.qdrant = env["WEBCTX_QDRANT_PATH"]
        specs = [(f"io{i}", "search,fetch,embed") for i in range(n)] + [("vec", "store,rank")]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [logdir / f"{name}.log" for name, _ in specs]
        for (name, queues), log in zip(specs, self.logs, strict=True):
            cmd = [
                sys.executable,
                "-m",
                "webctx.cli",
                "worker",
                "-Q",
                queues,
                "-n",
                f"{name}@%h",
                "-c",
                str(THREADS),
                "--loglevel",
                "INFO",  # "ready." is an INFO line
            ]
            with log.open("wb") as out:
                self.procs.append(
                    subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
                )
        deadline = time.monotonic() + 120
        while not all(b"ready." in log.read_bytes() for log in self.logs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                tails = [log.read_text()[-1500:] for log in self.logs]
                self.stop()
                raise SystemExit(f"workers did not start: {tails}")
            time.sleep(0.3)

    def rss_mb(self) -> dict[str, float]:
        """Resident memory by role: the largest search/fetch/embed process; the store/rank
        one's RSS, its PSS (a page mapped twice counts once), its anonymous memory (heap),
        and the part of its RSS that is the embedded engine's mapped files, with the
        write-ahead log's share of that apart (file-backed: the kernel can reclaim it)."""
        out = []
        for proc in self.procs:
            lines = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            kb = {k: int(v.split()[0]) for k, _, v in (ln.partition(":") for ln in lines)
                  if k in ("VmRSS", "RssAnon")}  # fmt: skip
            out.append((kb["VmRSS"] / 1024, kb["RssAnon"] / 1024))
        vec = self.procs[-1].pid
        rollup = Path(f"/proc/{vec}/smaps_rollup").read_text()
        pss = next(int(ln.split()[1]) for ln in rollup.splitlines() if ln.startswith("Pss:"))
        engine, wal = _mapped_kb(vec, self.qdrant)
        return {
            "io": max(rss for rss, _ in out[:-1]),
            "vec": out[-1][0],
            "vec_pss": pss / 1024,
            "vec_anon": out[-1][1],
            "vec_engine": engine / 1024,
            "vec_wal": wal / 1024,
        }

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) so far by role: all search/fetch/embed processes, and
        the store/rank one."""
        ticks = os.sysconf("SC_CLK_TCK")
        out = []
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / ticks)
        return {"io": sum(out[:-1]), "vec": out[-1]}

    def stop(self) -> None:
        """Warm shutdown of every process."""
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _mapped_kb(pid: int, under: str) -> tuple[int, int]:
    """Resident kB of process `pid`'s mappings of files under `under` (the engine's shards:
    `<path>` and `<path>.sparse`), and of those in a `wal` folder."""
    total = wal = 0
    path = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):  # a mapping
            path = head[5] if len(head) == 6 else ""
        elif head and head[0] == "Rss:" and path.startswith(under):
            total += int(head[1])
            wal += int(head[1]) if "/wal/" in path else 0
    return total, wal


@dataclass
class Run:
    """What one batch run measured."""

    label: str
    n: int
    elapsed_s: float
    latencies: list[float]
    stats: dict[str, object]
    downloads: int
    done: int
    failed: int
    cpu_s: dict[str, float] | None = None

    @property
    def per_min(self) -> float:
        """Questions finished per minute."""
        return (self.done + self.failed) / self.elapsed_s * 60 if self.elapsed_s else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
    procs = Workers(env, workers, run_dir)
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


def _throughput_table(runs: list[Run]) -> str:
    rows = [
        "| mode | questions | done | failed | wall s | questions/min | p50 item s | "
        "p95 item s | pages downloaded | tokens embedded | CPU s / question "
        "(search+fetch+embed, store+rank, web) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        cpu = (
            " / ".join(f"{r.cpu_s[k] / r.n:.2f}" for k in ("io", "vec", "web"))
            if r.cpu_s
            else "n/a"
        )
        rows.append(
            f"| {r.label} | {r.n} | {r.done} | {r.failed} | {r.elapsed_s:.1f} | "
            f"{r.per_min:.1f} | {_pct(r.latencies, 0.5):.1f} | "
            f"{_pct(r.latencies, 0.95):.1f} | {r.downloads} | "
            f"{r.stats['tokens_embedded']} | {cpu} |"
        )
    return "\n".join(rows)


def _cost_table(runs: list[Run]) -> str:
    rows = [
        "| questions | pages downloaded / q | pages reused / q | tokens embedded / q | "
        "search cache hit rate | embed cache hit rate | cost USD / q |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s = {k: str(v) for k, v in r.stats.items()}
        rows.append(
            f"| {r.n} | {r.downloads / r.n:.2f} | {int(s['pages_reused']) / r.n:.2f} | "
            f"{int(s['tokens_embedded']) / r.n:.0f} | {s['search_cache_hit_rate']} | "
            f"{s['embed_cache_hit_rate']} | {float(s['cost_usd']) / r.n:.6f} |"
        )
    return "\n".join(rows)


def _cpu_ceiling(most: Run, one: Run) -> str:
    """What the CPU per question says about the most a machine this size can do."""
    if not most.cpu_s:
        return ""
    per_q = sum(most.cpu_s.values()) / most.n
    cores = os.cpu_count() or 1
    need = 3 * one.per_min / 60 * per_q
    return (
        f"At {per_q:.2f} CPU s per question ({most.label}), {cores} cores cap the whole "
        f"pipeline at about {cores / per_q * 60:.0f} questions/min; 3× the 1-worker rate "
        f"would take {need:.1f} cores."
    )


def _rss_line(probe: dict[str, float], n: int) -> str:
    def growth(a: float, b: float) -> str:
        return f"{100 * (b / a - 1):+.0f} %" if a else "n/a"

    rows = [
        f"| batch | process | MB at item 10 | at item {n // 2} | at item {n} | growth 10→{n} | "
        f"growth {n // 2}→{n} |",
        "|---|---|---|---|---|---|---|",
    ]
    roles = (("io", "largest search/fetch/embed process, RSS"), ("vec", "store/rank process, RSS"),
             ("vec_pss", "store/rank process, PSS"),
             ("vec_anon", "store/rank process, anonymous memory"),
             ("vec_engine", "store/rank process, engine's mapped files"),
             ("vec_wal", "of which the engine's write-ahead log"))  # fmt: skip
    for prefix, batch in (("", "cold (index built)"), ("warm_", "warm (web indexed)")):
        for role, name in roles:
            early = probe.get(f"{prefix}rss10_{role}_mb", 0.0)
            mid = probe.get(f"{prefix}rss_mid_{role}_mb", 0.0)
            late = probe.get(f"{prefix}rss_end_{role}_mb", 0.0)
            rows.append(
                f"| {batch} | {name} | {early:.0f} | {mid:.0f} | {late:.0f} | "
                f"{growth(early, late)} | {growth(mid, late)} |"
            )
    return (
        f"Worker memory (target: growth ≤ +10 %). Cold: the {n}-question batch on cold caches, "
        f"while the web's pages are indexed; warm: the next {n} questions on the same "
        "workers.\n\n" + "\n".join(rows)
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
            print(_throughput_table(runs[-1:]), flush=True)
        if not args.no_embedded:
            runs.append(embedded_run(web, questions, n, Path(tmp)))
        for size in sizes:
            if size not in by_size:
                by_size[size] = broker_run(web, questions, size, max(counts), Path(tmp))[0]
    web.stop()
    total_s = time.monotonic() - started
    base = by_size[min(by_size)]
    top = by_size[max(by_size)]
    base_tok = int(base.stats["tokens_embedded"]) / base.n  # type: ignore[call-overload]
    top_tok = int(top.stats["tokens_embedded"]) / top.n  # type: ignore[call-overload]
    rate = {r.label: r.per_min for r in runs}
    idle, loaded = probe.get("idle_s", 0.0), probe.get("loaded_s", 0.0)
    one, most = runs[0], runs[len(counts) - 1]
    text = "\n".join(
        [
            f"QA web of `../shared/data/qa` (pages delayed 0.2–1 s, embeddings 0.2 s per request, "
            f"lexical vectors), questions from queries.jsonl in a seeded order (seed {SEED}), each "
            f"batch a prefix of it; cold caches per run (Redis flushed). "
            f"N workers = N search/fetch/embed processes + 1 store/rank process, {THREADS} "
            f"thread{'s' if THREADS > 1 else ''} each; a batch keeps {THREADS} "
            f"item{'s' if THREADS > 1 else ''} per search/fetch/embed process in flight "
            f"(the embedded default: its default threads and batch concurrency). "
            f"Whole run: "
            f"{total_s / 60:.1f} min."
            + (f" Scaled down: {n} questions instead of 200." if n != 200 else "")
            + " Load average at the end: "
            + ", ".join(f"{x:.1f}" for x in os.getloadavg())
            + f" ({os.cpu_count()} cores).",
            "",
            "### Throughput",
            "",
            _throughput_table(runs),
            "",
            f"{most.label} / {one.label}: {most.per_min / one.per_min:.2f}× the rate "
            f"(target ≥ 3×). {_cpu_ceiling(most, one)}",
            "",
            "### Cost as the batch grows",
            "",
            _cost_table([by_size[s] for s in sorted(by_size)]),
            "",
            f"Tokens embedded per question at {top.n}: {top_tok:.0f}, "
            f"{100 * top_tok / base_tok:.0f} % of the {base.n}-question figure (target ≤ 25 %); "
            f"page downloads per question at {top.n}: {top.downloads / top.n:.2f} (target ≤ 1).",
            "",
            "### Fairness and memory",
            "",
            f"Interactive research job (submission to bundle): idle {idle:.1f} s, while the "
            f"{n}-question batch runs on {max(counts)} workers {loaded:.1f} s "
            f"({loaded / max(idle, 0.01):.2f}×, target ≤ 1.5×).",
            "",
            _rss_line(probe, n),
            "",
            f"Rates: {json.dumps({k: round(v, 1) for k, v in rate.items()})}",
        ]
    )
    print(text)
    if args.write:
        write_section("batch_scaling", text)


if __name__ == "__main__":
    main()
