"""Benchmark the embedded vector engines: qdrant-edge vs qdrant-client local mode (on disk).

qdrant-edge runs three times: with float32 and with float16 vectors
(WEBCTX_QDRANT_VECTOR_DATATYPE), both on shards without a write-ahead log as webctx creates
them, and with float16 on a shard with a log, as earlier versions created them; every
upsert is flushed before it returns in all three. The float16 run's top-10 hits are
compared with float32's.

Both run through webctx's own adapters (EdgeVectorStore, QdrantVectorStore) for ingest,
reopen and the filtered search the rank stage does; the unfiltered search calls each engine
directly (our VectorStore always filters). Each engine runs alone in a child process, so
its peak RSS is its own and they do not share the CPU.

    .venv/bin/python bench/vector_store.py [--points 100000] [--queries 200] [--write]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import qdrant_edge as qe  # noqa: E402
from qdrant_client import QdrantClient  # noqa: E402

from bench._report import DOC, replace_block  # noqa: E402
from webctx.adapters.edge_store import EdgeVectorStore  # noqa: E402
from webctx.adapters.qdrant_store import QdrantVectorStore  # noqa: E402
from webctx.models import Chunk, StoredChunk  # noqa: E402
from webctx.protocols import VectorDatatype, VectorStore  # noqa: E402
from webctx.stages.store import make_points  # noqa: E402

ENGINES = {
    "edge": "qdrant-edge",
    "edge16": "qdrant-edge float16",
    "edge16log": "qdrant-edge float16 with a write-ahead log",
    "local": "qdrant-client local",
}
EDGE_DATATYPES: dict[str, VectorDatatype] = {
    "edge": "float32", "edge16": "float16", "edge16log": "float16"
}  # fmt: skip
AGREEMENT_QUERIES = 50  # filtered searches whose top 10 float16 and float32 must share
MODEL = "bench-embedding"
CHUNKS_PER_PAGE = 20
CHUNK_CHARS = 1000  # ~256 tokens, WEBCTX_CHUNK__MAX_TOKENS
WARMUP = 5
LOAD_AT_START: list[float] = []
BEGIN, END = "<!-- bench:vector_store -->", "<!-- /bench:vector_store -->"


# --- data ------------------------------------------------------------------------------------


def page_sha(page: int) -> str:
    return hashlib.sha256(f"page-{page}".encode()).hexdigest()


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    vectors = rng.standard_normal((n, dim), dtype=np.float32)
    unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit


def batches(n: int, dim: int, batch: int, seed: int = 1) -> Iterator[list[StoredChunk]]:
    """Points shaped like ours: 20 chunks per page, ~1000 chars of text each."""
    rng = np.random.default_rng(seed)
    filler = ("lorem ipsum dolor sit amet " * 40)[: CHUNK_CHARS - 12]
    for first in range(0, n, batch):
        size = min(batch, n - first)
        for page in range(first // CHUNKS_PER_PAGE, (first + size - 1) // CHUNKS_PER_PAGE + 1):
            lo = max(first, page * CHUNKS_PER_PAGE)
            hi = min(first + size, (page + 1) * CHUNKS_PER_PAGE)
            if lo >= hi:
                continue
            chunks = [
                Chunk(
                    content_sha256=page_sha(page),
                    index=i % CHUNKS_PER_PAGE,
                    start=(i % CHUNKS_PER_PAGE) * CHUNK_CHARS,
                    end=(i % CHUNKS_PER_PAGE + 1) * CHUNK_CHARS,
                    text=f"{i:011d} {filler}",
                    tokens=256,
                )
                for i in range(lo, hi)
            ]
            yield make_points(
                chunks,
                unit_vectors(rng, hi - lo, dim).tolist(),
                url=f"https://site{page % 997}.test/page/{page}",
                model=MODEL,
            )


def regroup(parts: Iterator[list[StoredChunk]], size: int) -> Iterator[list[StoredChunk]]:
    """Page-aligned pieces regrouped into upserts of exactly `size` points."""
    pending: list[StoredChunk] = []
    for part in parts:
        pending.extend(part)
        while len(pending) >= size:
            yield pending[:size]
            pending = pending[size:]
    if pending:
        yield pending


# --- one engine, in a child process -----------------------------------------------------------


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def open_store(engine: str, path: Path, dim: int) -> tuple[VectorStore, Callable[[], None]]:
    """The adapter over a store at `path`, and how to close it."""
    if engine in EDGE_DATATYPES:
        if engine == "edge16log" and not path.exists():
            create_logged_shard(path, dim)
        edge = EdgeVectorStore(path, datatype=EDGE_DATATYPES[engine])
        return edge, edge.close
    client = QdrantClient(path=str(path))
    return QdrantVectorStore(client, collection="bench"), client.close


def create_logged_shard(path: Path, dim: int) -> None:
    """A float16 shard with the engine's write-ahead log, as earlier webctx created them."""
    params = qe.EdgeVectorParams(
        size=dim, distance=qe.Distance.Cosine, datatype=qe.VectorStorageDatatype.Float16
    )
    qe.EdgeShard.create(str(path), qe.EdgeConfig(vectors=params)).close()


def unfiltered_query(engine: str, store: Any) -> Callable[[list[float]], object]:
    """A top-10 search without filter, straight on the engine (the adapter always filters)."""
    if engine in EDGE_DATATYPES:
        shard = store._shard  # the bench reaches in: webctx never searches unfiltered
        return lambda v: shard.query(
            qe.QueryRequest(
                limit=10, query=qe.Query.Nearest(v), with_payload=True, with_vector=True
            )
        )
    return lambda v: store.client.query_points(
        store.collection, query=v, limit=10, with_payload=True, with_vectors=True
    )


def latencies_ms(call: Callable[[int], object], n: int) -> list[float]:
    for i in range(WARMUP):
        call(i)
    out = []
    for i in range(n):
        start = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - start) * 1000)
    return out


def percentiles(values: Sequence[float]) -> dict[str, float]:
    return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95))}


def run_engine(engine: str, points: int, queries: int, dim: int, batch: int) -> dict[str, Any]:
    """Ingest, reopen and search one engine; returns its numbers."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{engine}-"))
    try:
        rss_before = rss_mb()
        store, close = open_store(engine, workdir / "store", dim)
        ingest_s = 0.0
        for chunk_batch in regroup(batches(points, dim, CHUNKS_PER_PAGE), batch):
            start = time.perf_counter()
            store.upsert(chunk_batch)
            ingest_s += time.perf_counter() - start
        close()
        start = time.perf_counter()
        store, close = open_store(engine, workdir / "store", dim)
        count = store.count()
        reopen_s = time.perf_counter() - start
        assert count == points, (count, points)
        result = {
            "points": points,
            "ingest_s": ingest_s,
            "reopen_s": reopen_s,
            **search_numbers(engine, store, points, queries, dim),
        }
        close()
        result["rss_delta_mb"] = peak_rss_mb() - rss_before
        # Allocated blocks, not file sizes: the engines preallocate sparse WAL/mmap files.
        files = [f for f in workdir.rglob("*") if f.is_file()]
        result["disk_mb"] = sum(f.stat().st_blocks * 512 for f in files) / 2**20
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def search_numbers(
    engine: str, store: VectorStore, points: int, queries: int, dim: int
) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    vectors = unit_vectors(rng, queries + WARMUP, dim).tolist()
    pages = points // CHUNKS_PER_PAGE
    filters = [
        [page_sha(int(p)) for p in rng.choice(pages, size=min(20, pages), replace=False)]
        for _ in range(queries + WARMUP)
    ]
    raw = unfiltered_query(engine, store)
    unfiltered = latencies_ms(lambda i: raw(vectors[i]), queries)
    hits: list[int] = []
    top10: dict[int, list[str]] = {}  # the first queries' hits, for float16 vs float32

    def filtered_call(i: int) -> None:
        found = store.search(vectors[i], limit=10, content_sha256s=filters[i])
        hits.append(len(found))
        if i < AGREEMENT_QUERIES:
            top10[i] = [f"{h.chunk.content_sha256}:{h.chunk.index}" for h in found]

    filtered = latencies_ms(filtered_call, queries)
    assert min(hits) == 10, "a filtered search returned fewer than 10 hits"
    return {"unfiltered": percentiles(unfiltered), "filtered": percentiles(filtered),
            "top10": [top10[i] for i in sorted(top10)]}  # fmt: skip


# --- the parent: both engines, the table, the doc section -----------------------------------


def run_child(engine: str, args: argparse.Namespace, points: int, queries: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--engine",
        engine,
        "--points",
        str(points),
        "--queries",
        str(queries),
        "--dim",
        str(args.dim),
        "--batch",
        str(args.batch),
    ]
    print(f"running {ENGINES[engine]}: {points:,} points, {queries} queries", file=sys.stderr)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["queries"] = queries
    return result


def table(
    edge: dict[str, Any], edge16: dict[str, Any], logged: dict[str, Any], local: dict[str, Any]
) -> str:
    """The Markdown table; the ratio columns are edge / local, float16 / float32 edge and
    float16 without a log / with one."""

    def row(name: str, key: Callable[[dict[str, Any]], float], ratio: bool = True) -> str:
        a, h, g, b = key(edge), key(edge16), key(logged), key(local)
        ratios = f"{a / b:.3g} | {h / a:.3g} | {h / g:.3g}" if ratio else " | | "
        return f"| {name} | {fmt(a)} | {fmt(h)} | {fmt(g)} | {fmt(b)} | {ratios} |"

    lines = [
        "| metric | qdrant-edge | qdrant-edge float16 | float16 with a log "
        "| qdrant-client local | edge/local | float16/edge | float16 no log/log |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        row("points", lambda r: r["points"], ratio=False),
        row("ingest, points/s (higher is better)", lambda r: r["points"] / r["ingest_s"]),
        row("ingest total, s", lambda r: r["ingest_s"]),
        row("reopen (load + count), s", lambda r: r["reopen_s"]),
    ]
    for kind, label in (
        ("unfiltered", "top-10 unfiltered"),
        ("filtered", "top-10, 20-page filter"),
    ):
        lines += [row(f"{label} {p}, ms", _pick(kind, p)) for p in ("p50", "p95")]
    lines += [
        row("peak RSS delta, MB", lambda r: r["rss_delta_mb"]),
        row("on disk, MB", lambda r: r["disk_mb"]),
    ]
    return "\n".join(lines)


def _pick(kind: str, percentile: str) -> Callable[[dict[str, Any]], float]:
    return lambda result: float(result[kind][percentile])


def agreement(edge: dict[str, Any], edge16: dict[str, Any]) -> str:
    """How many of float32's top-10 filtered hits float16 also returns."""
    pairs = list(zip(edge["top10"], edge16["top10"], strict=True))
    shared = sum(len(set(a) & set(b)) for a, b in pairs)
    same_order = sum(a == b for a, b in pairs)
    return (
        f"Float16 against float32 on the first {len(pairs)} filtered searches: "
        f"{shared}/{10 * len(pairs)} top-10 hits shared, {same_order}/{len(pairs)} lists in "
        "the same order."
    )


def fmt(value: float) -> str:
    if float(value).is_integer() and abs(value) >= 100:
        return f"{int(value):,}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    return (
        f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, qdrant-edge-py {version('qdrant-edge-py')}, "
        f"qdrant-client {version('qdrant-client')}"
    )


def section(
    body: str, args: argparse.Namespace, edge: dict[str, Any], local: dict[str, Any]
) -> str:
    """The doc section: what was run, where, and the table."""
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    command = " ".join(["bench/vector_store.py", *sys.argv[1:]])
    load = ", ".join(f"{x:.1f}" for x in LOAD_AT_START)
    notes = []
    if local["points"] != edge["points"]:
        notes.append(f"local mode held {local['points']:,} points, edge {edge['points']:,}")
    if local["queries"] != edge["queries"]:
        notes.append(
            f"local mode ran {local['queries']} queries per kind, edge {edge['queries']}: local"
            " mode checks every payload in Python on a filtered search, so 200 would take an hour"
        )
    note = "\n" + "".join(f"\n- {n}." for n in notes) if notes else ""
    return (
        f"{BEGIN}\n## Vector store: qdrant-edge vs qdrant-client local mode\n\n"
        f"`{command}` on {date}, {machine()}; load average {load} at start.\n\n"
        f"{args.dim}-dim random unit vectors in upserts of {args.batch}, payload like webctx's"
        f" (~{CHUNK_CHARS}-char text, {CHUNKS_PER_PAGE} chunks per page); top-10 searches"
        f" after {WARMUP} warm-up ones, returning payload and vectors; the filter is a"
        " `MatchAny` on content_sha256 of 20 random pages. Both stores on disk, ingest and"
        " filtered search through webctx's adapters, each engine alone in a child process;"
        " RSS delta is peak RSS minus RSS before opening the store. qdrant-edge runs three times:"
        " float32 vectors (the engine's default) and float16 (WEBCTX_QDRANT_VECTOR_DATATYPE)"
        " on shards without a write-ahead log as webctx creates them, then float16 on a shard"
        " with a log as earlier versions created them; every upsert is flushed before it"
        " returns in all three."
        f"{note}\n\n{body}\n{END}"
    )


def write_section(text: str) -> None:
    replace_block(BEGIN, END, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--local-points", type=int, help="points for local mode (default: --points)"
    )
    parser.add_argument(
        "--local-queries", type=int, default=20, help="queries for local mode (slow filter)"
    )
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(ROOT)}")
    parser.add_argument("--engine", choices=sorted(ENGINES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(run_engine(args.engine, args.points, args.queries, args.dim, args.batch)))
        return
    LOAD_AT_START[:] = os.getloadavg()  # the machine may be shared: say how busy it was
    edge = run_child("edge", args, args.points, args.queries)
    edge16 = run_child("edge16", args, args.points, args.queries)
    logged = run_child("edge16log", args, args.points, args.queries)
    local_queries = min(args.queries, args.local_queries)
    local = run_child("local", args, args.local_points or args.points, local_queries)
    body = table(edge, edge16, logged, local) + "\n\n" + agreement(edge, edge16) + "\n"
    text = section(body, args, edge, local)
    print(text)
    if args.write:
        write_section(text)
        print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
