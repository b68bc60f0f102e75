"""Benchmark the embedded index as it grows: search latency, time to searchable, disk and
recall at 100k → 1M chunks, for the shard layout webctx ships against the engine's
defaults (how shards were created before), side by side.

Points shaped like ours (20 chunks per page, ~150 words, 384-dim unit vectors, float16 as
the service stores them) are written through the adapter (`upsert` and `upsert_sparse`) in
pages' batches, every page marked live for one tenant. With "while writing" the writer
calls `optimize_if_due` after each 20,000 points (as a re-index run does between pages);
otherwise one `optimize()` follows the last write, as before. Then:

- time to searchable: from the last write to a store whose every point is in a graph
  (the final optimize);
- dense: `rank_live` top-50 ids with the tenant's scope; hybrid: dense + sparse top-50
  + RRF + `retrieve` of the fused top-10 (as `search_index`), p50 | p95 in ms;
- recall@10: the hybrid top-10 against the same fusion over an exact dense search
  (`SearchParams(exact=True)`, no graph, no quantization), and dense top-10 alone;
- disk: both shards' directories.

    .venv/bin/python bench/index_scale.py [--sizes 100000,250000] [--configs shipped,untuned]
        [--queries 200] [--write]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import qdrant_edge as qe  # noqa: E402

from webctx.adapters.edge_store import EdgeVectorStore, _scope_filter  # noqa: E402
from webctx.adapters.edge_tuning import UNTUNED, Tuning  # noqa: E402
from webctx.index.refresh import optimize_if_due  # noqa: E402
from webctx.index.search import RRF_K  # noqa: E402
from webctx.models import Chunk  # noqa: E402
from webctx.protocols import IndexScope  # noqa: E402
from webctx.stages.rank import ranks_in_order, rrf  # noqa: E402
from webctx.stages.store import make_points  # noqa: E402

PER_PAGE = 20
DIM = 384
SITES = 100
TENANT_KEY = "t0"
VOCAB = [f"w{i}" for i in range(5000)]
CONFIGS: dict[str, tuple[Tuning, bool]] = {
    "shipped": (Tuning(), True),  # (tuning, optimize while writing)
    "shipped, one optimize at the end": (Tuning(), False),
    "shipped, 8 segments before merging": (Tuning(segments=8), True),
    "int8 quantization, rescored": (Tuning(quantization=True), True),
    "untuned": (UNTUNED, False),
}


def sha(page: int) -> str:
    return hashlib.sha256(f"page-{page}".encode()).hexdigest()


TOPICS = 200


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


class Corpus:
    """Vectors with the structure of text embeddings: a chunk is its page's topic, plus its
    page's own direction, plus noise (uniform random vectors, which no embedding model
    gives, have no near neighbours and defeat every graph)."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(3)
        self.topics = unit_rows(rng, TOPICS)
        pages = n // PER_PAGE + 1
        self.topic_of = rng.integers(0, TOPICS, pages)
        self.pages = unit_rows(rng, pages)

    def vectors(self, pages: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        v = self.topics[self.topic_of[pages]] + 0.7 * self.pages[pages]
        v = v + 0.5 * unit_rows(rng, len(pages))
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def load(store: EdgeVectorStore, n: int, corpus: Corpus, *, while_writing: bool) -> float:
    """Write n points a page batch at a time, marking each batch live; seconds spent in
    optimize while writing."""
    rng = np.random.default_rng(7)
    optimizing = 0.0
    for first in range(0, n, 1000):
        chunks = []
        for i in range(first, min(n, first + 1000)):
            page, k = divmod(i, PER_PAGE)
            words = " ".join(VOCAB[j] for j in rng.zipf(1.3, 150) % len(VOCAB))
            chunks.append(Chunk(content_sha256=sha(page), index=k, start=k * 1000,
                                end=k * 1000 + 1000, text=words, tokens=256))  # fmt: skip
        page_ids = np.arange(first, first + len(chunks)) // PER_PAGE
        vectors = corpus.vectors(page_ids, rng).tolist()
        points = make_points(chunks, vectors, url="https://x.test/", model="bench")
        store.upsert(points)
        store.upsert_sparse(points)
        live = {sha(p): f"s{p % SITES}.test" for p in sorted(set(page_ids.tolist()))}
        store.mark_pages(tenant_key=TENANT_KEY, generation=1, live=live, dead=[])
        if while_writing:
            started = time.perf_counter()
            optimize_if_due(store)
            optimizing += time.perf_counter() - started
    return optimizing


def timed(fn: Callable[[int], object], n: int) -> tuple[float, float]:
    for i in range(min(5, n)):
        fn(i)
    samples = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples), statistics.quantiles(samples, n=20)[18]


def exact_dense(
    store: EdgeVectorStore, vector: list[float], limit: int, scope: IndexScope
) -> list[str]:
    shard = store._current()
    assert shard is not None
    request = qe.QueryRequest(limit=limit, query=qe.Query.Nearest(vector),
                              filter=_scope_filter(scope), with_payload=False,
                              params=qe.SearchParams(exact=True))  # fmt: skip
    return [str(h.id) for h in shard.query(request)]


def fused(dense: list[str], sparse: list[str]) -> list[str]:
    scores = rrf([ranks_in_order(dense), ranks_in_order(sparse)], k=RRF_K)
    return sorted(scores, key=lambda pid: (-scores[pid], pid))[:10]


def disk_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path), f"{path}.sparse"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return sum(int(line.split()[0]) for line in out.splitlines()) / 1024


def measure(name: str, n: int, queries: int) -> dict[str, float]:
    tuning, while_writing = CONFIGS[name]
    base = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    path = base / "qdrant"
    store = EdgeVectorStore(path, datatype="float16", tuning=tuning)
    corpus = Corpus(n)
    started = time.perf_counter()
    optimizing = load(store, n, corpus, while_writing=while_writing)
    written = time.perf_counter()
    store.optimize()
    searchable = time.perf_counter() - written
    rng = np.random.default_rng(11)
    vectors = corpus.vectors(rng.integers(0, n // PER_PAGE, queries + 5), rng).tolist()
    texts = [" ".join(VOCAB[j] for j in rng.integers(0, 200, 3)) for _ in range(queries + 5)]
    scope = IndexScope(tenant_key=TENANT_KEY, generation=1)
    s = store

    def hybrid(i: int) -> list[str]:
        top = fused(s.rank_live(vectors[i], limit=50, scope=scope),
                    s.rank_live_sparse(texts[i], limit=50, scope=scope))  # fmt: skip
        s.retrieve(top)
        return top

    dense = timed(lambda i: s.rank_live(vectors[i], limit=50, scope=scope), queries)
    both = timed(hybrid, queries)
    hits = dense_hits = 0
    for i in range(queries):
        approx = s.rank_live(vectors[i], limit=50, scope=scope)
        exact = exact_dense(s, vectors[i], 50, scope)
        sparse = s.rank_live_sparse(texts[i], limit=50, scope=scope)
        hits += len(set(fused(approx, sparse)) & set(fused(exact, sparse)))
        dense_hits += len(set(approx[:10]) & set(exact[:10]))
    row = {"points": float(n), "ingest_s": written - started, "optimizing_s": optimizing,
           "searchable_s": searchable, "dense_p50": dense[0], "dense_p95": dense[1],
           "hybrid_p50": both[0], "hybrid_p95": both[1], "recall": hits / (10 * queries),
           "dense_recall": dense_hits / (10 * queries), "open_mb": disk_mb(path),
           "segments": float(store._current().info().segments_count)}  # type: ignore[union-attr]  # fmt: skip
    store.close()
    row["disk_mb"] = disk_mb(path)  # at rest: what an optimize left behind is gone
    shutil.rmtree(base, ignore_errors=True)
    return row


def line(name: str, r: dict[str, float]) -> str:
    return (f"| {name} | {int(r['points']):,} | {r['ingest_s']:.0f} ({r['optimizing_s']:.0f}) | "
            f"{r['searchable_s']:.1f} | {r['dense_p50']:.2f} | {r['dense_p95']:.2f} | "
            f"{r['hybrid_p50']:.2f} | {r['hybrid_p95']:.2f} | {r['recall']:.3f} | "
            f"{r['dense_recall']:.3f} | {r['open_mb']:,.0f} | {r['disk_mb']:,.0f} | "
            f"{r['disk_mb'] / r['points'] * 1e6 / 1024:.2f} | {int(r['segments'])} |")  # fmt: skip


def ratio_line(n: int, shipped: dict[str, float], untuned: dict[str, float]) -> str:
    def r(key: str) -> str:
        return f"{shipped[key] / untuned[key]:.2f}" if untuned[key] else "–"

    return (f"- {n:,} chunks, shipped / untuned: last write → searchable {r('searchable_s')}, "
            f"written in {r('ingest_s')}, hybrid p50 {r('hybrid_p50')}, "
            f"p95 {r('hybrid_p95')}, disk {r('disk_mb')}")  # fmt: skip


HEAD = (
    "| layout | chunks | written in, s (optimizing) | last write → searchable, s "
    "| dense p50 | dense p95 | hybrid p50 | hybrid p95 | hybrid recall@10 "
    "| dense recall@10 | disk MB, open | disk MB, closed | GB per 1M, closed | segments |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,250000")
    parser.add_argument("--configs", default="shipped,untuned")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "unknown")  # fmt: skip
    load_before = __import__("os").getloadavg()[0]
    print(HEAD, flush=True)  # noqa: T201
    rows, ratios = [], []
    for n in (int(x) for x in args.sizes.split(",")):
        got = {}
        for name in args.configs.split(","):
            got[name] = measure(name, n, args.queries)
            rows.append(line(name, got[name]))
            print(rows[-1], flush=True)  # noqa: T201
        if "shipped" in got and "untuned" in got:
            ratios.append(ratio_line(n, got["shipped"], got["untuned"]))
    body = (
        f"{cpu}, 2 cores shared (load average {load_before:.1f} at start); "
        f"{args.queries} queries per row, p50/p95 in ms, one tenant holding every point.\n\n"
        + HEAD
        + "\n"
        + "\n".join(rows)
        + "\n\n"
        + "\n".join(ratios)
        + "\n"
    )
    print(body)  # noqa: T201
    if args.write:
        from bench._report import write_section

        write_section("index_scale", body)


if __name__ == "__main__":
    main()
