"""Answer recall of the lexical first pass (webctx.stages.prefilter) against embedding
every chunk, on the answer-recall QA web (bench/answer_recall.py: same questions, seeds,
pages and scoring).

For each job `prefilter_candidates` runs in process, as the rank task calls it, with the
settings of each row; "every chunk" selects all of them (what a job did before the pass:
every chunk embedded, BM25 over all of them). Vectors come from the QA web's model
in process (cached in bench/out/, as answer_recall's).

    .venv/bin/python bench/prefilter_recall.py [--questions 200] [--seeds 0,1] [--write]
        [--rows TEXT]  (only the rows whose name holds TEXT, besides "every chunk")
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import write_section  # noqa: E402
from bench.answer_recall import TOP_K, build_jobs, draw_samples  # noqa: E402
from bench.qa_web import CachedMiniLM, shared_qa, start_qa_web  # noqa: E402
from bench.recall_scoring import BUDGETS, Job, Tally, table  # noqa: E402
from webctx.models import BundleStats  # noqa: E402
from webctx.settings import ChunkSettings, PrefilterSettings  # noqa: E402
from webctx.stages.bundle import build_bundle  # noqa: E402
from webctx.stages.chunk import chunk_page  # noqa: E402
from webctx.stages.compose import fit_to_speed, fuse_selected  # noqa: E402
from webctx.stages.prefilter import select_candidates  # noqa: E402
from webctx.stages.rank import rank_chunks  # noqa: E402

EVERYTHING = 1_000_000
ROWS: dict[str, PrefilterSettings] = {
    "every chunk embedded (no first pass)": PrefilterSettings(chunks=EVERYTHING),
    "BM25 top 256 alone": PrefilterSettings(chunks=256, per_page=0, neighbours=0),
    "BM25 top 256 + 2 per page + neighbours of top 32": PrefilterSettings(
        chunks=256, per_page=2, neighbours=32),
    "BM25 top 512 + 2 per page + neighbours of top 32": PrefilterSettings(
        chunks=512, per_page=2, neighbours=32),
    "BM25 top 256 + 8 per page + neighbours of top 64": PrefilterSettings(
        chunks=256, per_page=8, neighbours=64),
    "BM25 top 512 + 8 per page + neighbours of top 128": PrefilterSettings(
        chunks=512, per_page=8, neighbours=128),
    "BM25 top 768 + 8 per page + neighbours of top 128": PrefilterSettings(
        chunks=768, per_page=8, neighbours=128),
    "BM25 top 768 + 16 per page + neighbours of top 256 (default)": PrefilterSettings(),
    "BM25 top 1024 + 8 per page + neighbours of top 128": PrefilterSettings(
        chunks=1024, per_page=8, neighbours=128),
}  # fmt: skip
NARROWED = (640, 512, 384, 256)
"""The default pass narrowed as a slow model's rank narrows it (`narrow_pass`) to at most
this many chunks, none embedded ahead (the worst case: a job whose pages all came at once)."""
for _n in NARROWED:
    ROWS[f"default narrowed to {_n} chunks"] = PrefilterSettings(embed_budget_s=float(_n))


def _score_job(job: Job, embedder: CachedMiniLM, tallies: dict[str, Tally],
               sizes: dict[str, list[int]]) -> None:  # fmt: skip
    """Every row's bundles for one job: chunks and vectors once, then per row the pass's
    selection (`select_candidates`) and the fusion `prefilter_candidates` applies
    (`fuse_selected`), packed by `rank_chunks` at every budget."""
    pages = {p.content_sha256: p for p in job.pages}
    question = job.question.question
    size = ChunkSettings().max_tokens
    chunks = [c for p in pages.values() for c in chunk_page(p, max_tokens=size, overlap_tokens=0)]
    vectors = embedder.embed([question, *(c.text for c in chunks)]).vectors
    for name, prefilter in ROWS.items():
        lexical = select_candidates(question, chunks, limit=prefilter.chunks,
                                    per_page=prefilter.per_page,
                                    neighbours=prefilter.neighbours)  # fmt: skip
        if name.startswith("default narrowed"):  # at 1 chunk a second for budget_s seconds
            lexical = fit_to_speed(lexical, chunks, prefilter=prefilter, chunks_per_s=1.0,
                                   embedded=lambda _: set())  # fmt: skip
        candidates = fuse_selected(
            vectors[0], [chunks[i] for i in lexical.selected],
            [vectors[i + 1] for i in lexical.selected],
            [lexical.scores[i] for i in lexical.selected], pages,
        )  # fmt: skip
        sizes[name].append(len(candidates))
        for budget in BUDGETS:
            ranked = rank_chunks(candidates, top_k=TOP_K, token_budget=budget)
            bundle = build_bundle(job_id="bench", question=question, queries=job.queries,
                                  pages=pages, ranked=ranked, failures=job.failures,
                                  stats=BundleStats())  # fmt: skip
            tallies[name].add(budget, job, [c.text for c in bundle.chunks],
                              bundle.stats.bundle_tokens)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--rows", default="", help="only rows whose name holds this text")
    args = parser.parse_args()
    for name in [n for n in ROWS if args.rows not in n and "every chunk" not in n]:
        del ROWS[name]
    loaded = shared_qa()
    if loaded is None:
        return
    docs, questions = loaded
    samples = draw_samples(questions, [int(s) for s in args.seeds.split(",")], args.questions)
    started = time.perf_counter()
    web = start_qa_web(docs)
    try:
        runs = {seed: build_jobs(web, qs) for seed, qs in samples.items()}
        print(f"fetched: {time.perf_counter() - started:.0f}s", flush=True)  # noqa: T201
        embedder = web.embedder
        pages = {p.content_sha256: p for jobs in runs.values() for j in jobs for p in j.pages}
        size = ChunkSettings().max_tokens
        texts = [
            c.text for p in pages.values() for c in chunk_page(p, max_tokens=size, overlap_tokens=0)
        ]
        for at in range(0, len(texts), 512):  # every chunk once, so rows share the cache
            embedder.embed(texts[at : at + 512])
            print(f"embedded {min(at + 512, len(texts))}/{len(texts)} chunks: "  # noqa: T201
                  f"{time.perf_counter() - started:.0f}s", flush=True)  # fmt: skip
        text = (
            f"{args.questions} questions per seed of shared/data/qa, seeds {args.seeds}, "
            "max_sources 8, top_k 200, as bench/answer_recall.py; the pass's selection, "
            "the candidates' cosine fused with their BM25 over all the job's chunks (RRF "
            "k=30), packed by `rank_chunks`. Chunks per job (median): "
        )
        sizes: dict[str, list[int]] = {name: [] for name in ROWS}
        tallies: dict[int, dict[str, Tally]] = {}
        for seed, jobs in runs.items():
            tallies[seed] = {name: Tally() for name in ROWS}
            for job in jobs:
                _score_job(job, embedder, tallies[seed], sizes)
            print(f"seed {seed} ranked: {time.perf_counter() - started:.0f}s", flush=True)  # noqa: T201
        text += ", ".join(f"{name}: {statistics.median(n):.0f}" for name, n in sizes.items())
        text += ".\n"
        for seed, rows in tallies.items():
            text += f"\nSeed {seed}:\n\n" + table(rows, len(runs[seed]), None) + "\n"
    finally:
        web.stop()
    print(text)  # noqa: T201
    if args.write:
        write_section("prefilter_recall", text)


if __name__ == "__main__":
    main()
