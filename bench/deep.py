"""Compound questions on the QA web: `depth=fast` against `depth=deep`, answer recall and
job time side by side in one run, through real jobs (a `webctx worker` process per side).

A compound question joins two questions about different pages: "Q1 Q2". A bundle hits
when it holds an answer string of both (bench/recall_scoring.py `hit`, at 1,000 tokens).
Recovered: the share of the compound questions `fast` misses that `deep` hits. Job time:
each bundle's `stats.elapsed_s` (submitted to bundle saved), one job at a time, a
question's fast and deep jobs one after the other (which first alternates), so both
sides meet the machine's load alike.

Both sides get the same treatment: their own Redis database and vector store (no page
one side embedded is known to the other), and every page's chunk vectors computed before
either side runs (bench/qa_web.py's cache), so neither pays the model for the other; the
tokens each side sends to the embeddings endpoint are counted and compared apart.

    .venv/bin/python bench/deep.py [--questions 60] [--seed 0] [--write]

Needs a Redis (WEBCTX_BENCH_REDIS_URL, default redis://127.0.0.1:$WEBCTX_TEST_REDIS_PORT);
databases 14 and 15 are flushed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench._report import write_section  # noqa: E402
from bench.batch_workers import Workers  # noqa: E402
from bench.qa_web import MODEL, OUT, QAWeb, Question, shared_qa, start_qa_web  # noqa: E402
from bench.recall_scoring import hit  # noqa: E402
from webctx.adapters.httpx_fetcher import HttpxFetcher  # noqa: E402
from webctx.models import Bundle  # noqa: E402
from webctx.net.addresses import AddressPolicy  # noqa: E402
from webctx.settings import ChunkSettings, FetchSettings  # noqa: E402
from webctx.stages.chunk import chunk_page  # noqa: E402
from webctx.stages.facets import split_facets  # noqa: E402
from webctx.stages.fetch import fetch_page  # noqa: E402

BUDGET, MAX_SOURCES, MAX_QUERIES, TOP_K = 1000, 8, 4, 200
REDIS = os.environ.get(
    "WEBCTX_BENCH_REDIS_URL", f"redis://127.0.0.1:{os.environ.get('WEBCTX_TEST_REDIS_PORT', 6379)}"
)
DATABASES = {"fast": 14, "deep": 15}  # not 11: the tests' default database


def compound_questions(
    questions: list[Question], n: int, seed: int
) -> list[tuple[Question, Question]]:
    """`n` pairs of questions about different pages, each a question that ends in '?', the
    pair split into its two questions again by `split_facets`."""
    rng = random.Random(seed)
    pool = [q for q in questions if q.question.strip().endswith("?")]
    pairs: list[tuple[Question, Question]] = []
    while len(pairs) < n:
        a, b = rng.sample(pool, 2)
        joined = f"{a.question.strip()} {b.question.strip()}"
        if a.doc_id != b.doc_id and len(split_facets(joined)) == 2:
            pairs.append((a, b))
    return pairs


def warm_vectors(web: QAWeb) -> float:
    """Compute every page's chunk vectors into the QA web's cache (seconds taken)."""
    started = time.perf_counter()
    fetcher = HttpxFetcher(FetchSettings(), policy=AddressPolicy(allowed_networks=["127.0.0.1/32"]))
    chunking = ChunkSettings()
    for url in web.served:
        page = fetch_page(url, fetcher)
        chunks = chunk_page(page, max_tokens=chunking.max_tokens,
                            overlap_tokens=chunking.overlap_tokens)  # fmt: skip
        texts = [c.text for c in chunks]
        for at in range(0, len(texts), 256):
            web.embedder.embed(texts[at : at + 256])
    fetcher.close()
    return time.perf_counter() - started


def side_env(web: QAWeb, depth: str, scratch: Path) -> dict[str, str]:
    """A worker's and client's environment for one side: its own Redis db and store."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("WEBCTX_", "CELERY_", "OPENAI_"))
    }
    env.update({
        "PYTHONPATH": str(ROOT),
        "CELERY_BROKER_URL": f"{REDIS}/{DATABASES[depth]}",
        "WEBCTX_QDRANT_PATH": str(scratch / f"qdrant-{depth}"),
        "WEBCTX_DATA_DIR": str(scratch / f"data-{depth}"),
        "WEBCTX_SEARCH_PROVIDER": "searxng",
        "WEBCTX_SEARXNG_URL": web.search.url,
        "OPENAI_BASE_URL": web.embeddings.url + "/v1",
        "OPENAI_API_KEY": "bench",
        "WEBCTX_EMBEDDING_MODEL": MODEL,
        "WEBCTX_ALLOWED_NETWORKS": "127.0.0.1/32",
        "WEBCTX_FETCH__PER_HOST_DELAY_S": "0",
    })  # fmt: skip
    return env


def run_job(env: dict[str, str], depth: str, question: str) -> Bundle:
    """One job of `depth`, waited for (`webctx research`)."""
    knobs = ["--max-sources", str(MAX_SOURCES), "--max-queries", str(MAX_QUERIES),
             "--top-k", str(TOP_K), "--token-budget", str(BUDGET)]  # fmt: skip
    cmd = [sys.executable, "-m", "webctx.cli", "research", question, "--format", "json",
           "--depth", depth, *knobs]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise SystemExit(f"{depth} job without a bundle: {done.stderr[-3000:]}")
    return Bundle.model_validate_json(done.stdout)


def run_sides(
    web: QAWeb, pairs: list[tuple[Question, Question]], scratch: Path
) -> dict[str, list[Bundle]]:
    """Every compound question as a fast job and a deep job, one job at a time, the two
    in turn (which goes first alternates), each side on its own worker."""
    clients = {d: redis.Redis.from_url(f"{REDIS}/{n}") for d, n in DATABASES.items()}
    envs = {depth: side_env(web, depth, scratch) for depth in DATABASES}
    workers = []
    out: dict[str, list[Bundle]] = {depth: [] for depth in DATABASES}
    try:
        for depth, client in clients.items():
            client.flushdb()
            logs = scratch / depth
            logs.mkdir()
            workers.append(Workers(envs[depth], 1, logs, threads=8))
        for n, (a, b) in enumerate(pairs):
            question = f"{a.question.strip()} {b.question.strip()}"
            order = ("fast", "deep") if n % 2 == 0 else ("deep", "fast")
            for depth in order:
                out[depth].append(run_job(envs[depth], depth, question))
    finally:
        for worker in workers:
            worker.stop()
        for client in clients.values():
            client.flushdb()
            client.close()
    return out


def both_hit(pair: tuple[Question, Question], bundle: Bundle) -> bool:
    """Both questions' answers are in the bundle's passages."""
    texts = [c.text for c in bundle.chunks]
    return hit(pair[0], texts) and hit(pair[1], texts)


def report(pairs: list[tuple[Question, Question]], fast: list[Bundle], deep: list[Bundle]) -> str:
    """The side-by-side table and the recovery figure."""
    n = len(pairs)
    fast_hits = [both_hit(p, b) for p, b in zip(pairs, fast, strict=True)]
    deep_hits = [both_hit(p, b) for p, b in zip(pairs, deep, strict=True)]
    missed = [i for i in range(n) if not fast_hits[i]]
    recovered = sum(deep_hits[i] for i in missed)
    lost = sum(fast_hits[i] and not deep_hits[i] for i in range(n))
    times = {"fast": [b.stats.elapsed_s for b in fast], "deep": [b.stats.elapsed_s for b in deep]}
    tokens = {"fast": sum(b.stats.tokens_embedded for b in fast),
              "deep": sum(b.stats.tokens_embedded for b in deep)}  # fmt: skip
    rounds = [len(b.stats.rounds) for b in deep]
    extra_pages = [sum(r.pages for r in b.stats.rounds[1:]) for b in deep]
    stops: dict[str, int] = {}
    for b in deep:
        why = b.stats.rounds[-1].stopped if b.stats.rounds else "none"
        stops[why] = stops.get(why, 0) + 1
    mean = {k: statistics.fmean(v) for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        f'{n} compound questions (two questions about different pages, "Q1 Q2"), '
        f"{BUDGET:,}-token bundles, max_sources {MAX_SOURCES}, max_queries {MAX_QUERIES}; "
        "a hit holds an answer of both.",
        "",
        "| depth | both answers | mean job s | median job s | tokens embedded |",
        "|---|---:|---:|---:|---:|",
        f"| fast | {sum(fast_hits)}/{n} ({sum(fast_hits) / n:.1%}) | {mean['fast']:.2f} | "
        f"{median['fast']:.2f} | {tokens['fast']:,} |",
        f"| deep | {sum(deep_hits)}/{n} ({sum(deep_hits) / n:.1%}) | {mean['deep']:.2f} | "
        f"{median['deep']:.2f} | {tokens['deep']:,} |",
        "",
        f"- **recovered by deep: {recovered}/{len(missed)} of fast's misses "
        f"({recovered / max(1, len(missed)):.1%})**; hits deep lost: {lost}",
        f"- job time deep/fast: mean {mean['deep'] / mean['fast']:.2f}x, median "
        f"{median['deep'] / median['fast']:.2f}x; tokens embedded deep/fast "
        f"{tokens['deep'] / max(1, tokens['fast']):.2f}x",
        f"- deep rounds per job: mean {statistics.fmean(rounds):.2f}; new pages past round 1: "
        f"mean {statistics.fmean(extra_pages):.1f}; why the last round stopped: "
        + ", ".join(f"{k} {v}" for k, v in sorted(stops.items())),
    ]
    return "\n".join(lines)


def cpu_line() -> str:
    """The CPU's model, its cores, the vector-instruction flags it has, the load."""
    info = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "?")
    flags = next((set(ln.split(":", 1)[1].split()) for ln in info if ln.startswith("flags")), set())
    wanted = ("avx2", "avx512_vnni", "avx512_bf16", "amx_tile")
    has = ", ".join(f for f in wanted if f in flags) or "none of " + ", ".join(wanted)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"CPU: {model}, {os.cpu_count()} cores ({has}); load average {load} at the end."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--docs", type=int, default=30,
                        help="the QA web holds the first N pages (their vectors are computed "
                        "ahead: minutes of CPU per 30 pages)")  # fmt: skip
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    loaded = shared_qa()
    if loaded is None:
        return
    docs, questions = loaded
    docs = docs[: args.docs]
    held = {d.id for d in docs}
    pairs = compound_questions([q for q in questions if q.doc_id in held], args.questions,
                               args.seed)  # fmt: skip
    web = start_qa_web(docs)
    try:
        warm = warm_vectors(web)
        print(f"page vectors ready in {warm:.0f}s ({web.embedder.computed} computed)", flush=True)  # noqa: T201
        with tempfile.TemporaryDirectory(prefix="webctx-deep-") as scratch:
            started = time.perf_counter()
            sides = run_sides(web, pairs, Path(scratch))
            print(f"jobs: {time.perf_counter() - started:.0f}s", flush=True)  # noqa: T201
    finally:
        web.stop()
    cpu = cpu_line()
    for depth, bundles in sides.items():  # for a look at the misses
        dump = OUT / f"deep-bundles-{depth}.jsonl"
        dump.write_text("".join(b.model_dump_json() + "\n" for b in bundles))
    body = (
        f"The QA web's first {len(docs)} pages (its search over those alone). "
        + report(pairs, sides["fast"], sides["deep"])
        + f"\n\n{cpu}"
    )
    print(body)  # noqa: T201
    if args.write:
        write_section("deep", body)


if __name__ == "__main__":
    main()
