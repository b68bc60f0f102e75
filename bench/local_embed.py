"""The local model side by side: torch vs ONNX Runtime fp32 and int8 vs OpenVINO bf16.

Real chunks: the QA pages (shared/data/qa) cut by `chunk_page` with the default
ChunkSettings (64 cl100k tokens, no overlap), pages shuffled with a fixed seed, the first
`--chunks`. Each backend runs in a process of its own (so its RSS is its own: the ONNX
processes never import torch once the export is cached); the parent asks them in turn,
round after round, to embed the same chunks, so the machine's load falls on all of them
alike. Reported per backend: chunks/s (wall, best round), CPU seconds per 1,000 chunks
(the process's user+sys time, less sensitive to other load than wall time), RSS after
the runs and its peak, and parity with torch: cosine of each chunk's two vectors, and
the overlap of each chunk's 10 nearest neighbours among all chunks.

    .venv/bin/python bench/local_embed.py [--chunks 2048] [--rounds 2] [--write]

The ONNX export is made (or reused) first in the cache dir WEBCTX_EMBED__LOCAL_CACHE_DIR
names, the user cache dir by default; its one-off cost is reported apart.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import time
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench._report import write_section  # noqa: E402
from bench.qa_web import data_dir  # noqa: E402

BACKENDS = ("torch", "onnx", "onnx-int8", "openvino-bf16")
JOB_CHUNKS = 2024  # an 8-source job in issue #22: 2,024 chunks, 96k tokens


def load_chunks(n: int, seed: int = 0) -> list[str]:
    """The first `n` default-size chunks of the QA pages, in a seeded page order."""
    from webctx.models import Page
    from webctx.settings import ChunkSettings
    from webctx.stages.chunk import chunk_page

    lines = (data_dir() / "qa" / "docs.jsonl").read_text().splitlines()
    docs = [json.loads(line) for line in lines if line.strip()]
    random.Random(seed).shuffle(docs)
    size = ChunkSettings()
    chunks: list[str] = []
    for doc in docs:
        page = Page(url=doc["url_path"], final_url=doc["url_path"], content_sha256=doc["id"],
                    fetched_at=datetime.now(UTC), text=doc["text"])  # fmt: skip
        chunks += [c.text for c in chunk_page(page, max_tokens=size.max_tokens,
                                              overlap_tokens=size.overlap_tokens)]  # fmt: skip
        if len(chunks) >= n:
            break
    return chunks[:n]


def _rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MB."""
    # VmHWM, not ru_maxrss: the latter survives exec, so a spawned child would report
    # its parent's peak.
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
                  if ":" in line)  # fmt: skip
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def _serve(backend: str, cache_dir: str | None, conn: Connection) -> None:
    """Child process: build one backend, then embed on request until told to stop."""
    from webctx.settings import EmbedSettings
    from webctx.workers.deps import build_local_embedder

    embedder = build_local_embedder(EmbedSettings(local_backend=backend,  # type: ignore[arg-type]
                                                  local_cache_dir=cache_dir))  # fmt: skip
    started = time.perf_counter()
    embedder.embed(["warm up"])
    conn.send({"load_s": time.perf_counter() - started, "modules": "torch" in sys.modules})
    while (texts := conn.recv()) is not None:
        cpu, wall = time.process_time(), time.perf_counter()
        vectors = np.asarray(embedder.embed(texts).vectors, dtype=np.float32)
        conn.send({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                   "vectors": vectors, "rss": _rss_mb()})  # fmt: skip


def neighbour_overlap(ref: np.ndarray, other: np.ndarray, k: int = 10) -> float:
    """Mean share of each chunk's k nearest neighbours (self excluded) both agree on."""
    def top(v: np.ndarray) -> np.ndarray:
        sims = v @ v.T
        np.fill_diagonal(sims, -2.0)
        return np.argsort(-sims, axis=1)[:, :k]

    a, b = top(ref), top(other)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b, strict=True)]))


def ensure_export(cache_dir: str | None) -> dict[str, float]:
    """Export (or find) both ONNX files before timing; seconds each took here."""
    from webctx.adapters.onnx_embedder import OnnxEmbedder
    from webctx.adapters.onnx_export import default_cache_dir

    took = {}
    for quantized in (False, True):
        started = time.perf_counter()
        folder = Path(cache_dir) if cache_dir else default_cache_dir() / "onnx"
        OnnxEmbedder(cache_dir=folder, quantized=quantized).embed(["x"])
        took["int8" if quantized else "fp32"] = time.perf_counter() - started
    return took


def run(chunks: list[str], rounds: int, cache_dir: str | None) -> dict[str, dict[str, object]]:
    """Every backend's timings, RSS and vectors, the backends asked in turn each round."""
    ctx = mp.get_context("spawn")
    pipes, procs = {}, []
    for backend in BACKENDS:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(backend, cache_dir, child), daemon=True)
        proc.start()
        pipes[backend], procs = parent, procs + [proc]
    stats: dict[str, dict[str, object]] = {b: {"runs": []} for b in BACKENDS}
    for backend in BACKENDS:
        stats[backend].update(pipes[backend].recv())
    for _ in range(rounds):
        for backend in BACKENDS:
            pipes[backend].send(chunks)
            answer = pipes[backend].recv()
            stats[backend]["runs"].append((answer["wall"], answer["cpu"]))  # type: ignore[attr-defined]
            stats[backend]["vectors"], stats[backend]["rss"] = answer["vectors"], answer["rss"]
    for backend in BACKENDS:
        pipes[backend].send(None)
    for proc in procs:
        proc.join(timeout=30)
    return stats


def report(chunks: list[str], stats: dict[str, dict[str, object]], rounds: int,
           export: dict[str, float]) -> str:  # fmt: skip
    """The markdown section."""
    from webctx.adapters.onnx_embedder import cores_present, native_bf16

    ref = np.asarray(stats["torch"]["vectors"])
    rows = ["| backend | chunks/s (wall) | vs torch | CPU s / 1k chunks | vs torch | "
            f"{JOB_CHUNKS}-chunk job, wall | RSS MB (peak) | cosine to torch min / mean | "
            "top-10 neighbours shared | torch imported |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    base_rate = base_cpu = 0.0
    for backend in BACKENDS:
        s = stats[backend]
        runs = s["runs"]
        wall = min(w for w, _ in runs)  # type: ignore[attr-defined]
        cpu = min(c for _, c in runs)  # type: ignore[attr-defined]
        rate, cpu_k = len(chunks) / wall, cpu / len(chunks) * 1000
        if backend == "torch":
            base_rate, base_cpu = rate, cpu_k
        vectors = np.asarray(s["vectors"])
        cos = (vectors * ref).sum(axis=1)
        rss, peak = s["rss"]  # type: ignore[misc]
        rows.append(
            f"| {backend} | {rate:.0f} | {rate / base_rate:.2f}x | {cpu_k:.2f} | "
            f"{base_cpu / cpu_k:.2f}x | {JOB_CHUNKS / rate:.1f} s | {rss:.0f} ({peak:.0f}) | "
            f"{cos.min():.4f} / {cos.mean():.4f} | {neighbour_overlap(ref, vectors):.3f} | "
            f"{'yes' if s['modules'] else 'no'} |"
        )
    walls = {b: [round(w, 1) for w, _ in stats[b]["runs"]] for b in BACKENDS}  # type: ignore[attr-defined]
    amx = "multiplies bf16 in hardware (AMX or AVX512-BF16), and `auto` picks bf16"
    if not native_bf16():
        amx = "does not multiply bf16 in hardware: bf16 is emulated, and `auto` does not pick it"
    return "\n".join([
        f"{len(chunks)} chunks of the QA pages (shared/data/qa) at the default chunk size "
        f"(64 cl100k tokens), embedded by all-MiniLM-L6-v2 on each backend in a process of "
        f"its own, asked in turn for {rounds} rounds (best round shown; all walls "
        f"s: {walls}). {cores_present()} cores present, shared with other work: compare the "
        "ratios measured side by side, not the absolute rates. ONNX Runtime: threads = cores "
        "present, idle threads not spinning; int8 = dynamic quantization of the MatMul "
        "weights, a scale per channel. OpenVINO: the fp32 graph compiled with bf16 "
        f"inference precision, latency hint, threads = cores present; this CPU {amx}. "
        "Neighbours: each chunk's 10 nearest among all chunks by cosine, the share both "
        "backends agree on.",
        "",
        *rows,
        "",
        f"One-off export (torch.onnx from the packaged weights, then quantization), cached "
        f"afterwards: fp32 {export['fp32']:.1f} s, int8 {export['int8']:.1f} s on this run "
        "(near 0 when the cache already held them).",
    ])


def main() -> None:
    """Parse arguments, run, print, optionally write the section."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    chunks = load_chunks(args.chunks)
    export = ensure_export(args.cache_dir)
    stats = run(chunks, args.rounds, args.cache_dir)
    body = report(chunks, stats, args.rounds, export)
    print(body)
    if args.write:
        write_section("local_embed", body)


if __name__ == "__main__":
    main()
