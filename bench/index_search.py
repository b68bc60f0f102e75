"""Benchmark index search latency: top-10 hybrid (dense + BM25, RRF) over N chunks.

Points shaped like ours (20 chunks per page, ~1000 chars, 384-dim unit vectors) go into
each engine through webctx's adapters (dense `upsert` and `upsert_sparse`); then queries run
the store half of `search_index` exactly as it does: a dense and a sparse query, both
filtered by the tenant's content hashes (MatchAny), fused in Python. "all pages" filters by
every page's hash (a tenant that owns the whole index: the worst case of that filter);
"one site" by the ~1 % of pages of one site. The Redis half (reading the tenant's pointers)
is timed separately, for the same page count.

    .venv/bin/python bench/index_search.py [--points 100000] [--queries 200]
        [--engines edge,local] [--local-points 20000] [--write]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from qdrant_client import QdrantClient  # noqa: E402

from webctx.adapters.edge_store import EdgeVectorStore  # noqa: E402
from webctx.adapters.qdrant_store import QdrantVectorStore  # noqa: E402
from webctx.index import IndexedPage, PageIndex  # noqa: E402
from webctx.models import Chunk  # noqa: E402
from webctx.ports import IndexStore  # noqa: E402
from webctx.sparse import rrf  # noqa: E402
from webctx.stages.store import make_points  # noqa: E402

PER_PAGE = 20
DIM = 384
SITES = 100
VOCAB = [f"w{i}" for i in range(5000)]


def sha(page: int) -> str:
    return hashlib.sha256(f"page-{page}".encode()).hexdigest()


def load(store: IndexStore, n: int, rng: np.random.Generator) -> None:
    for first in range(0, n, 1000):
        chunks, vectors = [], []
        for i in range(first, min(n, first + 1000)):
            page, k = divmod(i, PER_PAGE)
            words = " ".join(VOCAB[j] for j in rng.zipf(1.3, 150) % len(VOCAB))
            chunks.append(Chunk(content_sha256=sha(page), index=k, start=k * 1000,
                                end=k * 1000 + 1000, text=words, tokens=256))  # fmt: skip
        vecs = rng.standard_normal((len(chunks), DIM)).astype(np.float32)
        vectors = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).tolist()
        points = make_points(chunks, vectors, url="https://x.test/", model="bench")
        store.upsert(points)
        store.upsert_sparse(points)


def hybrid(store: IndexStore, vector: list[float], text: str, hashes: list[str]) -> list[str]:
    dense = store.search(vector, limit=50, content_sha256s=hashes)
    sparse = store.search_sparse(text, limit=50, content_sha256s=hashes)
    keys = [[f"{h.chunk.content_sha256}:{h.chunk.start}" for h in hits]
            for hits in (dense, sparse)]  # fmt: skip
    return [k for k, _ in rrf(keys)[:10]]


def timed(fn: Callable[[int], object], n: int) -> tuple[float, float]:
    for i in range(5):
        fn(i)
    samples = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - t) * 1000)
    q = statistics.quantiles(samples, n=20)
    return statistics.median(samples), q[18]


def open_store(engine: str, path: Path) -> tuple[IndexStore, Callable[[], None]]:
    if engine == "edge":
        edge = EdgeVectorStore(path)
        return edge, edge.close
    client = QdrantClient(path=str(path))
    return QdrantVectorStore(client, collection="bench"), client.close


def bench_engine(engine: str, points: int, queries: int) -> list[str]:
    rng = np.random.default_rng(7)
    store, close = open_store(engine, Path(tempfile.mkdtemp(prefix=f"bench-{engine}-")))
    started = time.perf_counter()
    load(store, points, rng)
    ingest = time.perf_counter() - started
    pages = points // PER_PAGE
    every = [sha(p) for p in range(pages)]
    one_site = [sha(p) for p in range(0, pages, SITES)]
    qv = rng.standard_normal((queries + 5, DIM)).astype(np.float32)
    vectors = (qv / np.linalg.norm(qv, axis=1, keepdims=True)).tolist()
    texts = [" ".join(VOCAB[j] for j in rng.integers(0, 200, 3)) for _ in range(queries + 5)]
    rows = []
    for label, hashes in (("all pages", every), ("one site", one_site)):
        dense = timed(lambda i, h=hashes: store.search(vectors[i], limit=10, content_sha256s=h),
                      queries)  # fmt: skip
        both = timed(lambda i, h=hashes: hybrid(store, vectors[i], texts[i], h), queries)
        rows.append(f"| {engine} | {points:,} | {label} ({len(hashes)} hashes) | {dense[0]:.2f} | "
                    f"{dense[1]:.2f} | {both[0]:.2f} | {both[1]:.2f} |")  # fmt: skip
    close()
    print(f"{engine}: ingest {points} points (dense + sparse) {ingest:.1f} s")  # noqa: T201
    return rows


def bench_pointers(pages: int, queries: int) -> tuple[float, float]:
    r = redis.Redis.from_url(os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15"),
                             decode_responses=True)  # fmt: skip
    r.flushdb()
    index = PageIndex(r)
    now = time.time()
    for p in range(pages):
        rec = IndexedPage(
            url=f"https://s{p % SITES}.test/{p}", source_id="s", content_sha256=sha(p),
            model="bench", fetched_at=now, changed_at=now, site=f"s{p % SITES}.test",
        )  # fmt: skip
        index.touch("bench", rec)
    result = timed(lambda _: index.current("bench"), queries)
    r.flushdb()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--engines", default="edge,local")
    parser.add_argument("--local-points", type=int, help="fewer points for local mode (slow)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    rows = []
    for engine in args.engines.split(","):
        n = args.local_points if engine == "local" and args.local_points else args.points
        rows += bench_engine(engine, n, args.queries)
    pointers = bench_pointers(args.points // PER_PAGE, min(args.queries, 50))
    body = (
        f"{args.points:,} chunks ({args.points // PER_PAGE:,} pages, 20 chunks each, {DIM}-dim), "
        f"{args.queries} queries, top-10; p50 / p95 in ms. `edge` is the embedded engine, "
        "`local` qdrant-client local mode (on disk). Dense = the adapter's filtered `search`; "
        "hybrid = dense + sparse (both top-50) + RRF in Python, as `search_index` does.\n\n"
        "| engine | chunks | filter | dense p50 | dense p95 | hybrid p50 | hybrid p95 |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        f"Reading the tenant's pointers from Redis and filtering them "
        f"({args.points // PER_PAGE:,} pages): p50 {pointers[0]:.1f} ms, "
        f"p95 {pointers[1]:.1f} ms.\n"
    )
    print(body)  # noqa: T201
    if args.write:
        from bench._report import write_section

        write_section("index_search", body)


if __name__ == "__main__":
    main()
