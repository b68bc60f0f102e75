"""Answer recall of webctx bundles per token budget, against baselines, on a loopback web.

The QA web (bench/qa_web.py) serves SQuAD pages (shared/data/qa) as HTML, a
SearxNG-compatible BM25 search over them and an OpenAI-compatible embeddings endpoint
backed by all-MiniLM-L6-v2. For each sampled question webctx's stage functions run in
process, as the Celery tasks call them: `plan_queries` -> `search_query` (SearxngSearch
over HTTP) -> `merge_results`, first `max_sources` URLs -> `fetch_page` (HttpxFetcher
over HTTP + trafilatura) -> `index_page` (chunk, embed through the OpenAI client, store
in a MemoryVectorStore) -> `answer_question` (rank, bundle). Each URL is fetched and each
page indexed once (the pipeline reuses stored points by id in the same way).

A question is a hit at a budget when a normalised answer string (whitespace-collapsed,
case-folded) is a substring of the normalised bundle text. Same jobs, same pages, same
embeddings for every system:

- webctx: `answer_question` with the default ChunkSettings, top_k 200 (the budget binds).
- (a) dense: fixed 500-character chunks, cosine, top chunks until the budget.
- (b) BM25: BM25 of the question over the same 500-character chunks.
- floor: webctx with the hashed embedder (lexical, no model).
- ceiling: the answer anywhere in the extracted text of the job's pages.

Citations: every bundle chunk must equal `page.text[start:end]` of its source and appear
verbatim (whitespace-normalised) in the HTML as served.

    .venv/bin/python bench/answer_recall.py [--questions 200] [--seed 0] [--variants] [--write]
"""

from __future__ import annotations

import argparse
import random
import sys
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
    data_dir,
    load_qa,
    normalize,
    start_qa_web,
    visible_text,
)  # noqa: E402
from bench.quality_baselines import (  # noqa: E402
    EMBED_CAPS,
    ChunkIndex,
    Ranking,
    bm25_baseline,
    dense_baseline,
    fixed_chunks,
    token_chunker,
    variant_select,
)
from webctx.adapters.hash_embedder import HashEmbedder  # noqa: E402
from webctx.adapters.httpx_fetcher import HttpxFetcher  # noqa: E402
from webctx.adapters.memory_store import MemoryVectorStore  # noqa: E402
from webctx.adapters.openai_embedder import OpenAIEmbedder  # noqa: E402
from webctx.adapters.searxng_search import SearxngSearch  # noqa: E402
from webctx.errors import FetchError  # noqa: E402
from webctx.models import Bundle, BundleStats, Failure, Page  # noqa: E402
from webctx.netguard import AddressPolicy  # noqa: E402
from webctx.ports import Embedder  # noqa: E402
from webctx.research import answer_question, index_page  # noqa: E402
from webctx.settings import ChunkSettings, EmbedSettings, FetchSettings  # noqa: E402
from webctx.stages.bundle import validate_offsets  # noqa: E402
from webctx.stages.embed import embed_texts  # noqa: E402
from webctx.stages.fetch import fetch_page  # noqa: E402
from webctx.stages.plan import plan_queries  # noqa: E402
from webctx.stages.search import merge_results, search_query  # noqa: E402

BUDGETS = (250, 500, 1000, 2000, 4000)
MAX_SOURCES, MAX_QUERIES, RESULTS_PER_QUERY, TOP_K = 8, 4, 10, 200


@dataclass
class Job:
    """A question with the pages the pipeline fetched for it."""

    question: Question
    queries: list[str]
    pages: list[Page]
    failures: list[Failure]
    qvec: np.ndarray | None = None


@dataclass
class Tally:
    """Hits per budget of one system, and the largest bundle seen per budget."""

    hits: dict[int, int] = field(default_factory=dict)
    over_budget: int = 0

    def add(self, budget: int, job: Job, texts: Sequence[str], tokens: int) -> None:
        self.hits[budget] = self.hits.get(budget, 0) + hit(job.question, texts)
        self.over_budget += tokens > budget


def hit(question: Question, texts: Sequence[str]) -> bool:
    """Whether any answer string occurs in the texts (normalised)."""
    bundle = normalize(" \n ".join(texts))
    return any(normalize(a) in bundle for a in question.answers)


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
        pages, failures = [], []
        for result in merged[:MAX_SOURCES]:
            if result.url not in fetched:
                try:
                    fetched[result.url] = fetch_page(result.url, fetcher)
                except FetchError as exc:
                    fetched[result.url] = Failure(url=result.url, stage="fetch", error=str(exc))
            got = fetched[result.url]
            (pages if isinstance(got, Page) else failures).append(got)
        jobs.append(Job(question, queries, pages, failures))
    fetcher.close()
    return jobs


def run_webctx(
    jobs: Sequence[Job],
    embedder: Embedder,
    tally: Tally,
    check: Callable[[Job, Bundle], None] | None,
) -> None:
    """Index every page once, then answer every job at every budget with answer_question."""
    store = MemoryVectorStore()
    seen: set[str] = set()
    for job in jobs:
        for page in job.pages:
            if page.content_sha256 not in seen:
                seen.add(page.content_sha256)
                index_page(page, embedder=embedder, store=store, chunking=ChunkSettings(),
                           embedding=EmbedSettings())  # fmt: skip
    for n, job in enumerate(jobs):
        for budget in BUDGETS:
            bundle = answer_question(
                job_id=f"bench-{n}", question=job.question.question, queries=job.queries,
                pages={p.content_sha256: p for p in job.pages}, failures=job.failures,
                stats=BundleStats(), embedder=embedder, store=store, top_k=TOP_K,
                token_budget=budget, embedding=EmbedSettings(),
            )  # fmt: skip
            tally.add(budget, job, [c.text for c in bundle.chunks], bundle.stats.bundle_tokens)
            if check is not None:
                check(job, bundle)


@dataclass
class Citations:
    """Bundle chunks checked against their source text and the served HTML."""

    web: QAWeb
    chunks: int = 0
    exact: int = 0
    verbatim: int = 0
    _served: dict[str, str] = field(default_factory=dict)

    def __call__(self, job: Job, bundle: Bundle) -> None:
        pages = {p.content_sha256: p for p in job.pages}
        problems = validate_offsets(bundle, pages)
        by_id = {s.id: s for s in bundle.sources}
        self.chunks += len(bundle.chunks)
        self.exact += len(bundle.chunks) - len(problems)
        for chunk in bundle.chunks:
            url = by_id[chunk.source].final_url
            if url not in self._served:
                self._served[url] = visible_text(self.web.served.get(url, ""))
            self.verbatim += normalize(chunk.text) in self._served[url]


def question_vectors(jobs: Sequence[Job], embedder: Embedder) -> None:
    """Embed every question once (through the same endpoint)."""
    out = embed_texts([j.question.question for j in jobs], embedder, **EMBED_CAPS).vectors
    for job, vec in zip(jobs, out, strict=True):
        v = np.asarray(vec)
        job.qvec = v / (np.linalg.norm(v) or 1.0)


def run_baselines(jobs: Sequence[Job], embedder: Embedder, dense: Tally, lexical: Tally) -> None:
    """Baselines (a) and (b) over fixed 500-character chunks."""
    index = ChunkIndex(fixed_chunks, embedder)
    index.add([p for j in jobs for p in j.pages])
    for job in jobs:
        assert job.qvec is not None
        for budget in BUDGETS:
            a = dense_baseline(index, job.pages, job.qvec, budget)
            dense.add(budget, job, [c.text for c in a], sum(c.tokens for c in a))
            b = bm25_baseline(index, job.pages, job.question.question, budget)
            lexical.add(budget, job, [c.text for c in b], sum(c.tokens for c in b))


VARIANTS: dict[str, tuple[int, int, bool, Ranking]] = {
    # name: (max_tokens, overlap_tokens, title prefix, ranking)
    "256/32 cosine (defaults before #11)": (256, 32, False, Ranking(fusion=False)),
    "128/16 cosine": (128, 16, False, Ranking(fusion=False)),
    "64/0 cosine": (64, 0, False, Ranking(fusion=False)),
    "128/16 RRF": (128, 16, False, Ranking()),
    "64/0 RRF": (64, 0, False, Ranking()),
    "64/0 RRF k=20": (64, 0, False, Ranking(rrf_k=20)),
    "64/0 RRF, pool 100": (64, 0, False, Ranking(pool=100)),
    "64/0 RRF, cap 8": (64, 0, False, Ranking(per_source_cap=8)),
    "64/0 RRF, title prefix": (64, 0, True, Ranking()),
}


def run_variants(jobs: Sequence[Job], embedder: Embedder, names: Sequence[str]) -> dict[str, Tally]:
    """Candidate chunking and ranking rules over the same jobs."""
    out: dict[str, Tally] = {}
    indexes: dict[tuple[int, int, bool], ChunkIndex] = {}
    for name in names:
        size, overlap, prefix, ranking = VARIANTS[name]
        key = (size, overlap, prefix)
        if key not in indexes:
            indexes[key] = ChunkIndex(token_chunker(size, overlap), embedder, title_prefix=prefix)
            started = time.perf_counter()
            indexes[key].add([p for j in jobs for p in j.pages])
            print(f"  indexed {key} in {time.perf_counter() - started:.0f}s", flush=True)  # noqa: T201
        tally = out[name] = Tally()
        for job in jobs:
            assert job.qvec is not None
            picks = variant_select(
                indexes[key], job.pages, job.question.question, job.qvec, BUDGETS, ranking
            )
            for budget, chunks in zip(BUDGETS, picks, strict=True):
                tally.add(budget, job, [c.text for c in chunks], sum(c.tokens for c in chunks))
        print(f"  {name}: {_cells(tally, len(jobs))}", flush=True)  # noqa: T201
    return out


def _cells(tally: Tally, n: int) -> str:
    return " | ".join(f"{tally.hits.get(b, 0) / n:.3f}" for b in BUDGETS)


def _table(rows: dict[str, Tally], n: int, ceiling: float) -> str:
    head = "| system | " + " | ".join(f"{b} tok" for b in BUDGETS) + " | over budget |"
    lines = [head, "|---|" + "---:|" * (len(BUDGETS) + 1)]
    for name, tally in rows.items():
        lines.append(f"| {name} | {_cells(tally, n)} | {tally.over_budget} |")
    lines.append("| ceiling (answer in fetched pages) | " + " | ".join(
        f"{ceiling:.3f}" for _ in BUDGETS) + " | |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="*", help="score ranking variants (names, or all)")
    parser.add_argument("--no-floor", action="store_true", help="skip the hashed-embedder floor")
    parser.add_argument("--no-webctx", action="store_true", help="baselines and variants only")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    loaded = load_qa(data_dir() / "qa")
    if loaded is None:
        print(f"no QA data at {data_dir() / 'qa'}: nothing to measure")  # noqa: T201
        return
    docs, all_questions = loaded
    questions = random.Random(args.seed).sample(
        all_questions, min(args.questions, len(all_questions))
    )
    started = time.perf_counter()
    web = start_qa_web(docs)
    try:
        embedder = OpenAIEmbedder(base_url=web.embeddings.url + "/v1", api_key="bench", model=MODEL)
        jobs = build_jobs(web, questions)
        print(f"jobs built in {time.perf_counter() - started:.0f}s", flush=True)  # noqa: T201
        question_vectors(jobs, embedder)
        n = len(jobs)
        ceiling = sum(hit(j.question, [p.text for p in j.pages]) for j in jobs) / n
        rows: dict[str, Tally] = {}
        citations = Citations(web)
        if not args.no_webctx:
            rows["webctx"] = Tally()
            run_webctx(jobs, embedder, rows["webctx"], citations)
            print(
                f"webctx: {_cells(rows['webctx'], n)}  ({time.perf_counter() - started:.0f}s)",
                flush=True,
            )  # noqa: T201
        rows["(a) 500-char chunks, cosine"], rows["(b) 500-char chunks, BM25"] = Tally(), Tally()
        run_baselines(jobs, embedder, rows["(a) 500-char chunks, cosine"],
                      rows["(b) 500-char chunks, BM25"])  # fmt: skip
        print(f"(a): {_cells(rows['(a) 500-char chunks, cosine'], n)}", flush=True)  # noqa: T201
        print(f"(b): {_cells(rows['(b) 500-char chunks, BM25'], n)}", flush=True)  # noqa: T201
        if not args.no_floor:
            rows["floor: webctx, hashed embedder"] = Tally()
            run_webctx(jobs, HashEmbedder(), rows["floor: webctx, hashed embedder"], None)
        variants = {}
        if args.variants is not None:
            names = list(VARIANTS) if args.variants in ([], ["all"]) else args.variants
            variants = run_variants(jobs, embedder, names)
    finally:
        web.stop()
    elapsed = time.perf_counter() - started
    text = (
        f"{n} questions of shared/data/qa (SQuAD v1.1 train pages, dev split), seed {args.seed}; "
        f"max_sources {MAX_SOURCES}, top_k {TOP_K}, embeddings {MODEL} via the loopback "
        f"OpenAI-compatible endpoint; stage functions run in process (plan, search over HTTP, "
        f"fetch over HTTP, index_page, answer_question). Share of questions whose bundle "
        f"contains an answer string, per token budget (cl100k of chunk texts).\n\n"
        + _table(rows, n, ceiling)
        + f"\n\nCitations: {citations.exact}/{citations.chunks} bundle chunks equal "
        f"source_text[start:end]; {citations.verbatim}/{citations.chunks} appear verbatim "
        f"(whitespace-normalised) in the page as served. Failed fetches: "
        f"{sum(len(j.failures) for j in jobs)}. Run time {elapsed:.0f} s "
        f"({web.embedder.computed} texts embedded, the rest from bench/out/ cache)."
    )
    if variants:
        text += "\n\nVariants (chunk max/overlap tokens, ranking), same jobs:\n\n" + _table(
            variants, n, ceiling
        )
    print(text)  # noqa: T201
    if args.write:
        write_section("answer_recall", text)


if __name__ == "__main__":
    main()
