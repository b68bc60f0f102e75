"""Answer recall of webctx bundles per token budget, against baselines, on a loopback web.

The QA web (bench/qa_web.py) serves SQuAD pages (shared/data/qa) as HTML, a
SearxNG-compatible BM25 search over them and an OpenAI-compatible embeddings endpoint
backed by all-MiniLM-L6-v2. For each sampled question webctx's stage functions run in
process, as the Celery tasks call them (the Celery layer itself does not run):
`plan_queries` -> `search_query` (SearxngSearch over HTTP) -> `merge_results`, first
`max_sources` URLs -> `fetch_page` (HttpxFetcher over HTTP + trafilatura) -> `index_page`
(chunk, embed through the OpenAI client, store in a MemoryVectorStore) -> the two steps of
`answer_question`: `retrieve_candidates` once per question, `rank_chunks` + `build_bundle`
once per budget. Each URL is fetched and each page indexed once for all seeds (the
pipeline reuses stored points by id in the same way).

A question is a hit at a budget when a normalised answer string (whitespace-collapsed,
case-folded) is a substring of the normalised bundle text. Same jobs, same pages, same
embeddings for every system:

- webctx: the default ChunkSettings and ranking, top_k 200 (the budget binds).
- (a) dense: fixed 500-character chunks, cosine, top chunks until the budget.
- (b) BM25: BM25 of the question over the same 500-character chunks.
- floor: webctx with the hashed embedder (lexical, no model).
- ceiling: the answer anywhere in the extracted text of the job's pages.
- engine (`--engine`): webctx with its points in the embedded engine (qdrant-edge) instead,
  once with float32 and once with float16 vectors (WEBCTX_QDRANT_VECTOR_DATATYPE).
- variants (`--variants`): other chunkings and ranking rules (bench/quality_baselines.py).

Seeds draw disjoint samples: each from the questions earlier seeds left.

Citations: every bundle chunk must equal `page.text[start:end]` of its source and appear
verbatim (whitespace-normalised) in the HTML as served.

    .venv/bin/python bench/answer_recall.py [--questions 200] [--seeds 0,1]
        [--variants [NAME ...|all]] [--no-floor] [--engine] [--write]

Vectors are cached in bench/out/ ($WEBCTX_BENCH_OUT to use another folder).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench._report import write_section  # noqa: E402
from bench.qa_web import (  # noqa: E402
    MODEL,
    QAWeb,
    Question,
    shared_qa,
    start_qa_web,
)  # noqa: E402
from bench.quality_baselines import (  # noqa: E402
    ChunkIndex,
    JobView,
    Ranking,
    bm25_baseline,
    dense_baseline,
    embed_all,
    fixed_chunks,
    token_chunker,
    variant_select,
)
from bench.recall_scoring import BUDGETS, Citations, Job, Tally, cells, hit, table  # noqa: E402
from webctx.adapters.edge_store import EdgeVectorStore  # noqa: E402
from webctx.adapters.hash_embedder import HashEmbedder  # noqa: E402
from webctx.adapters.httpx_fetcher import HttpxFetcher  # noqa: E402
from webctx.adapters.memory_store import MemoryVectorStore  # noqa: E402
from webctx.adapters.openai_embedder import OpenAIEmbedder  # noqa: E402
from webctx.adapters.searxng_search import SearxngSearch  # noqa: E402
from webctx.errors import FetchError  # noqa: E402
from webctx.models import Bundle, BundleStats, Failure, Page  # noqa: E402
from webctx.net.addresses import AddressPolicy  # noqa: E402
from webctx.protocols import Embedder, VectorStore  # noqa: E402
from webctx.settings import ChunkSettings, EmbedSettings, FetchSettings  # noqa: E402
from webctx.stages.bundle import build_bundle  # noqa: E402
from webctx.stages.compose import index_page, retrieve_candidates  # noqa: E402
from webctx.stages.fetch import fetch_page  # noqa: E402
from webctx.stages.plan import plan_queries  # noqa: E402
from webctx.stages.rank import rank_chunks  # noqa: E402
from webctx.stages.search import merge_results, search_query  # noqa: E402
from webctx.stages.store import vector_lookup  # noqa: E402

MAX_SOURCES, MAX_QUERIES, RESULTS_PER_QUERY, TOP_K = 8, 4, 10, 200


def build_jobs(web: QAWeb, questions: Sequence[Question]) -> list[Job]:
    """Plan, search and fetch for every question (each URL fetched once)."""
    search = SearxngSearch(web.search.url)
    fetcher = HttpxFetcher(FetchSettings(), policy=AddressPolicy(allowed_networks=["127.0.0.1/32"]))
    fetched: dict[str, Page | Failure] = {}
    jobs = []
    for question in questions:
        queries = plan_queries(question.question, max_queries=MAX_QUERIES)
        limit = max(RESULTS_PER_QUERY, MAX_SOURCES)
        merged = merge_results([search_query(search, q, limit=limit) for q in queries])
        pages: list[Page] = []
        failures: list[Failure] = []
        for result in merged[:MAX_SOURCES]:
            if result.url not in fetched:
                try:
                    fetched[result.url] = fetch_page(result.url, fetcher)
                except FetchError as exc:
                    fetched[result.url] = Failure(url=result.url, stage="fetch", error=str(exc))
            got = fetched[result.url]
            if isinstance(got, Page):
                pages.append(got)
            else:
                failures.append(got)
        jobs.append(Job(question, queries, pages, failures))
    fetcher.close()
    return jobs


def index_pages(
    jobs: Sequence[Job], embedder: Embedder, store: VectorStore | None = None
) -> VectorStore:
    """Index every distinct page of the jobs once, as the embed task does (index_page), in
    `store` (default: a new MemoryVectorStore)."""
    store = MemoryVectorStore() if store is None else store
    pages = {p.content_sha256: p for j in jobs for p in j.pages}
    for page in pages.values():
        index_page(page, embedder=embedder, store=store, chunking=ChunkSettings(),
                   embedding=EmbedSettings())  # fmt: skip
    return store


def run_webctx(
    jobs: Sequence[Job],
    embedder: Embedder,
    store: VectorStore,
    tally: Tally,
    check: Callable[[Job, Bundle], None] | None,
) -> None:
    """Answer every job at every budget: answer_question's retrieval (question embedding,
    search, BM25 fusion) once per job, its packing and bundle once per budget."""
    for n, job in enumerate(jobs):
        pages = {p.content_sha256: p for p in job.pages}
        candidates = retrieve_candidates(
            question=job.question.question, pages=pages, stats=BundleStats(),
            embedder=embedder, store=store, top_k=TOP_K, embedding=EmbedSettings(),
        )  # fmt: skip
        vectors = vector_lookup(store, embedder.model)
        for budget in BUDGETS:
            ranked = rank_chunks(candidates, top_k=TOP_K, token_budget=budget, vectors=vectors)
            bundle = build_bundle(
                job_id=f"bench-{n}", question=job.question.question, queries=job.queries,
                pages=pages, ranked=ranked, failures=job.failures, stats=BundleStats(),
            )  # fmt: skip
            tally.add(budget, job, [c.text for c in bundle.chunks], bundle.stats.bundle_tokens)
            if check is not None:
                check(job, bundle)


def question_vectors(jobs: Sequence[Job], embedder: Embedder) -> None:
    """Embed every question once (through the same endpoint)."""
    out = embed_all([j.question.question for j in jobs], embedder)
    for job, vec in zip(jobs, out, strict=True):
        v = np.asarray(vec)
        job.qvec = v / (np.linalg.norm(v) or 1.0)


def run_baselines(jobs: Sequence[Job], index: ChunkIndex, dense: Tally, lexical: Tally) -> None:
    """Baselines (a) and (b) over fixed 500-character chunks."""
    for job in jobs:
        assert job.qvec is not None
        view = index.view(job.pages, job.question.question, job.qvec)
        for budget in BUDGETS:
            a = dense_baseline(view, budget)
            dense.add(budget, job, [c.text for c in a], sum(c.tokens for c in a))
            b = bm25_baseline(view, budget)
            lexical.add(budget, job, [c.text for c in b], sum(c.tokens for c in b))


@dataclass(frozen=True)
class Variant:
    """A chunking (max tokens, overlap, title prefix) and a ranking rule."""

    max_tokens: int = 64
    overlap: int = 0
    title_prefix: bool = False
    ranking: Ranking = Ranking()


# Ranking rules over the shipped chunking: cheap (no new embeddings), run by `--variants`.
RANKING_VARIANTS: dict[str, Variant] = {
    "64/0 cosine only, no cap": Variant(ranking=Ranking(fusion=False)),
    "64/0 RRF k=60, cap 3 (webctx before this change)": Variant(
        ranking=Ranking(rrf_k=60, per_source_cap=3)),
    "64/0 RRF k=60, cap 8": Variant(ranking=Ranking(rrf_k=60, per_source_cap=8)),
    "64/0 RRF k=60, no cap": Variant(ranking=Ranking(rrf_k=60)),
    "64/0 RRF k=20, no cap": Variant(ranking=Ranking(rrf_k=20)),
    "64/0 RRF k=30, no cap (webctx)": Variant(),
}
# Chunkings: each embeds every page again (minutes of CPU), run by name or `all`.
CHUNKING_VARIANTS: dict[str, Variant] = {
    "256/32 cosine, cap 3 (defaults before #11)": Variant(256, 32, ranking=Ranking(
        fusion=False, per_source_cap=3)),
    "128/0 RRF, no cap": Variant(128, 0),
    "32/0 RRF, no cap": Variant(32, 0),
    "64/0 title-prefixed embedding input, RRF k=30, no cap": Variant(title_prefix=True),
}
VARIANTS = {**RANKING_VARIANTS, **CHUNKING_VARIANTS}


def run_variants(
    jobs: Sequence[Job], embedder: Embedder, names: Sequence[str],
    indexes: dict[tuple[int, int, bool], ChunkIndex],
) -> dict[str, Tally]:  # fmt: skip
    """Candidate chunking and ranking rules over the same jobs (indexes shared by seeds)."""
    out: dict[str, Tally] = {}
    views: dict[tuple[int, int, bool], list[JobView]] = {}
    for name in names:
        variant = VARIANTS[name]
        key = (variant.max_tokens, variant.overlap, variant.title_prefix)
        if key not in indexes:
            indexes[key] = ChunkIndex(token_chunker(key[0], key[1]), embedder, title_prefix=key[2])
        if key not in views:
            started = time.perf_counter()
            indexes[key].add([p for j in jobs for p in j.pages])
            views[key] = [index_view(indexes[key], job) for job in jobs]
            print(f"  indexed {key} in {time.perf_counter() - started:.0f}s", flush=True)  # noqa: T201
        tally = out[name] = Tally()
        for job, view in zip(jobs, views[key], strict=True):
            picks = variant_select(view, BUDGETS, variant.ranking)
            for budget, chunks in zip(BUDGETS, picks, strict=True):
                tally.add(budget, job, [c.text for c in chunks], sum(c.tokens for c in chunks))
        print(f"  {name}: {cells(tally, len(jobs))}", flush=True)  # noqa: T201
    return out


def index_view(index: ChunkIndex, job: Job) -> JobView:
    """The job's chunks under `index`, scored for its question."""
    assert job.qvec is not None
    return index.view(job.pages, job.question.question, job.qvec)


def draw_samples(
    questions: Sequence[Question], seeds: Sequence[int], n: int
) -> dict[int, list[Question]]:
    """`n` questions per seed; each seed draws from the questions earlier seeds left, so
    the samples are disjoint (the first is `random.Random(seed).sample(questions, n)`)."""
    left = list(questions)
    out: dict[int, list[Question]] = {}
    for seed in seeds:
        out[seed] = random.Random(seed).sample(left, min(n, len(left)))
        taken = {q.id for q in out[seed]}
        left = [q for q in left if q.id not in taken]
    return out


@dataclass
class SeedRun:
    """One seed's jobs and its systems' tallies."""

    jobs: list[Job]
    rows: dict[str, Tally] = field(default_factory=dict)
    variants: dict[str, Tally] = field(default_factory=dict)

    @property
    def ceiling(self) -> float:
        """Share of questions whose answer is in the extracted text of the fetched pages."""
        return sum(hit(j.question, [p.text for p in j.pages]) for j in self.jobs) / len(self.jobs)


class Clock:
    """Wall seconds per phase, printed as they end."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now
        print(f"{phase}: {now - self.started:.0f}s", flush=True)  # noqa: T201

    def total(self) -> float:
        return time.perf_counter() - self.started


def measure(
    web: QAWeb, samples: dict[int, list[Question]], args: argparse.Namespace, clock: Clock
) -> dict[int, SeedRun]:
    """Every system on every seed's jobs; pages are chunked and embedded once for all."""
    embedder = OpenAIEmbedder(base_url=web.embeddings.url + "/v1", api_key="bench", model=MODEL)
    runs = {seed: SeedRun(build_jobs(web, qs)) for seed, qs in samples.items()}
    all_jobs = [j for run in runs.values() for j in run.jobs]
    question_vectors(all_jobs, embedder)
    clock.lap("plan, search, fetch")
    store = index_pages(all_jobs, embedder)
    clock.lap("webctx: chunk, embed, store")
    fixed = ChunkIndex(fixed_chunks, embedder)
    fixed.add([p for j in all_jobs for p in j.pages])
    clock.lap("baselines: chunk, embed")
    indexes: dict[tuple[int, int, bool], ChunkIndex] = {}
    hashed, hashed_store = HashEmbedder(), None
    with tempfile.TemporaryDirectory(prefix="webctx-recall-") as scratch:
        engines: dict[str, EdgeVectorStore] = {}
        if args.engine:  # the same pages in the embedded engine, as each datatype stores them
            for datatype in ("float32", "float16"):
                edge = EdgeVectorStore(Path(scratch) / datatype, datatype=datatype)
                engines[f"webctx, qdrant-edge {datatype}"] = edge
                index_pages(all_jobs, embedder, edge)
            clock.lap("webctx: store in qdrant-edge")
        for seed, run in runs.items():
            check = args.citations if seed == min(runs) else None
            run.rows["webctx"] = Tally()
            run_webctx(run.jobs, embedder, store, run.rows["webctx"], check)
            print(f"seed {seed} webctx: {cells(run.rows['webctx'], len(run.jobs))}")  # noqa: T201
            clock.lap("webctx: rank, bundle")
            for name, engine in engines.items():
                run.rows[name] = Tally()
                run_webctx(run.jobs, embedder, engine, run.rows[name], None)
                print(f"seed {seed} {name}: {cells(run.rows[name], len(run.jobs))}")  # noqa: T201
                clock.lap("webctx on qdrant-edge: rank, bundle")
            dense, lexical = Tally(), Tally()
            run.rows["(a) 500-char chunks, cosine"] = dense
            run.rows["(b) 500-char chunks, BM25"] = lexical
            run_baselines(run.jobs, fixed, dense, lexical)
            clock.lap("baselines: rank")
            if not args.no_floor:
                if hashed_store is None:
                    hashed_store = index_pages(all_jobs, hashed)
                floor = run.rows["floor: webctx, hashed embedder"] = Tally()
                run_webctx(run.jobs, hashed, hashed_store, floor, None)
                clock.lap("floor")
            if args.variants is not None:
                names = (list(RANKING_VARIANTS) if args.variants == [] else
                         list(VARIANTS) if args.variants == ["all"] else args.variants)  # fmt: skip
                print(f"seed {seed} variants:", flush=True)  # noqa: T201
                run.variants = run_variants(run.jobs, embedder, names, indexes)
                clock.lap("variants")
        for edge in engines.values():
            edge.close()
    return runs


def report(runs: dict[int, SeedRun], citations: Citations, clock: Clock, web: QAWeb) -> str:
    """The docs section: method, one table per seed, citations, run time, variants."""
    first = runs[min(runs)]
    n = len(first.jobs)
    seeds = ", ".join(str(s) for s in runs)
    text = (
        f"{n} questions of shared/data/qa (SQuAD v1.1 train pages, dev split) per seed, seeds "
        f"{seeds} (disjoint samples: each seed draws from the questions earlier seeds left); "
        f"max_sources {MAX_SOURCES}, top_k {TOP_K}, embeddings {MODEL} via the loopback "
        "OpenAI-compatible endpoint. What runs is the pipeline's stage functions in process, "
        "in the order the Celery tasks call them (not the Celery layer): `plan_queries`, "
        "`search_query` over HTTP, `merge_results`, `fetch_page` over HTTP, `index_page` "
        "(chunk, embed, store in a MemoryVectorStore) once per distinct page, then "
        "`retrieve_candidates` once per question and `rank_chunks` + `build_bundle` once per "
        "budget (`answer_question` is exactly these two steps). Share of questions whose bundle "
        "contains an answer string, per token budget (cl100k of chunk texts). The hashed "
        "embedder row is a floor (lexical only, no model), not a result.\n"
    )
    for seed, run in runs.items():
        text += f"\nSeed {seed}:\n\n" + table(run.rows, len(run.jobs), run.ceiling) + "\n"
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in clock.phases.items())
    text += (
        f"\nCitations (seed {min(runs)}, every chunk of every bundle): "
        f"{citations.exact}/{citations.chunks} equal source_text[start:end]; "
        f"{citations.verbatim}/{citations.chunks} appear verbatim (whitespace-normalised) in "
        "the page as served (target 100 %), invisible format characters (U+200B, U+200E, "
        "U+FEFF) included: trafilatura drops them, extraction puts them back "
        "(webctx.stages.format_chars). Failed fetches: "
        f"{sum(len(j.failures) for r in runs.values() for j in r.jobs)}. Run time "
        f"{clock.total():.0f} s ({web.embedder.computed} texts embedded, the rest from the "
        f"bench/out/ cache): {phases}."
    )
    if first.variants:
        text += "\n\n### Variants\n\nChunk max/overlap tokens and ranking, same jobs and pages."
        for seed, run in runs.items():
            text += f"\n\nSeed {seed}:\n\n" + table(run.variants, len(run.jobs), None)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--seeds", default="0,1", help="comma-separated; samples are disjoint")
    parser.add_argument("--variants", nargs="*",
                        help="variants: none named = ranking ones; names; all")  # fmt: skip
    parser.add_argument("--no-floor", action="store_true", help="skip the hashed-embedder floor")
    parser.add_argument("--engine", action="store_true",
                        help="also webctx on qdrant-edge, float32 and float16")  # fmt: skip
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    loaded = shared_qa()
    if loaded is None:
        return
    docs, all_questions = loaded
    seeds = [int(s) for s in args.seeds.split(",")]
    samples = draw_samples(all_questions, seeds, args.questions)
    clock = Clock()
    web = start_qa_web(docs)
    try:
        args.citations = Citations(web)
        runs = measure(web, samples, args, clock)
    finally:
        web.stop()
    text = report(runs, args.citations, clock, web)
    print(text)  # noqa: T201
    for missing in args.citations.missing[:20]:
        print("not verbatim in the served page:", repr(missing[:300]))  # noqa: T201
    if args.write:
        write_section("answer_recall", text)


if __name__ == "__main__":
    main()
