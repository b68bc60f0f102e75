"""Coverage and abstention of webctx bundles on the loopback QA web (bench/qa_web.py).

The QA questions are split in two by page (a page's questions all on one side): `fit`
and `report`. `--fit` fits the coverage model (webctx.stages.coverage) on the fit half
and prints its coefficients; every figure printed is measured on the report half.

Scenarios, each question run through the pipeline's stage functions as
bench/answer_recall.py runs them (plan, search and fetch over HTTP, chunk, embed, store,
then `facet_pools`, `pack_facets`, `covered_bundle` per budget):

- full: the whole web;
- removed: the web without every page holding one of the question's answers (its search
  results and fetches skip them);
- paragraph: the answer's paragraph cut from its page (the page is still found);
- compound: two questions from different pages asked as one, "Q1 Q2".

A bundle holds an answer when a normalised answer string is in its text (recall_scoring).
Abstention: AUROC of `coverage.confidence` between bundles holding the answer (full web)
and bundles of a web with no answer (removed, paragraph when no fetched page holds it);
`sufficient=false` rates at the shipped threshold. Calibration: reliability in 10 bins and
ECE over every single-question bundle. Side by side: the same jobs packed as before
(`rank_chunks` alone, one facet) for recall at 250/500/1,000 tokens.

    .venv/bin/python bench/sufficiency.py [--questions 120] [--pairs 60] [--fit] [--write]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from bench._report import write_section  # noqa: E402
from bench.answer_recall import MAX_QUERIES, MAX_SOURCES, RESULTS_PER_QUERY, TOP_K  # noqa: E402
from bench.calibration import auroc, reliability  # noqa: E402
from bench.qa_web import MODEL, OUT, QAWeb, Question, normalize, shared_qa, start_qa_web  # noqa: E402
from bench.recall_scoring import hit  # noqa: E402
from bench.sufficiency_fit import COVERAGE_BUDGET, Record, fit_half_text, fit_model  # noqa: E402
from webctx.adapters.httpx_fetcher import HttpxFetcher  # noqa: E402
from webctx.adapters.memory_store import MemoryVectorStore  # noqa: E402
from webctx.adapters.openai_embedder import OpenAIEmbedder  # noqa: E402
from webctx.adapters.searxng_search import SearxngSearch  # noqa: E402
from webctx.errors import FetchError, ProviderUnavailable  # noqa: E402
from webctx.models import Bundle, BundleStats, Page, ScoredChunk, SearchResult  # noqa: E402
from webctx.net.addresses import AddressPolicy  # noqa: E402
from webctx.settings import ChunkSettings, EmbedSettings, FetchSettings  # noqa: E402
from webctx.stages import coverage as cov  # noqa: E402
from webctx.stages.bundle import build_bundle  # noqa: E402
from webctx.stages.compose import covered_bundle, facet_pools, index_page  # noqa: E402
from webctx.stages.facets import split_facets  # noqa: E402
from webctx.stages.fetch import fetch_page  # noqa: E402
from webctx.stages.plan import plan_queries  # noqa: E402
from webctx.stages.rank import rank_chunks  # noqa: E402
from webctx.stages.search import merge_results, search_query  # noqa: E402
from webctx.stages.shares import Packed, pack_facets  # noqa: E402
from webctx.stages.store import vector_lookup  # noqa: E402

BUDGETS = (250, 500, 1000, 3000)
# Packing and bundling seconds of single questions, and how many bundles they made.
SECONDS = {"before": 0.0, "with coverage": 0.0, "bundles": 0.0}


def split_of(question: Question) -> str:
    """fit or report, by a hash of the question's page."""
    digest = hashlib.sha256(question.doc_id.encode()).digest()
    return "fit" if digest[0] % 2 == 0 else "report"


@dataclass
class Web:
    """The QA web's clients: search, fetch (each URL once), the store of every page."""

    qa: QAWeb
    search: SearxngSearch
    fetcher: HttpxFetcher
    embedder: OpenAIEmbedder
    store: MemoryVectorStore = field(default_factory=MemoryVectorStore)
    fetched: dict[str, Page | None] = field(default_factory=dict)
    indexed: set[str] = field(default_factory=set)

    def page(self, url: str) -> Page | None:
        if url not in self.fetched:
            try:
                self.fetched[url] = fetch_page(url, self.fetcher)
            except FetchError:
                self.fetched[url] = None
        return self.fetched[url]

    def index(self, page: Page) -> None:
        if page.content_sha256 not in self.indexed:
            index_page(page, embedder=self.embedder, store=self.store,
                       chunking=ChunkSettings(), embedding=EmbedSettings())  # fmt: skip
            self.indexed.add(page.content_sha256)


def answer_urls(web: Web, answers: Sequence[str]) -> set[str]:
    """The URLs of every page holding one of the answers (as `hit` matches them)."""
    wanted = [normalize(a) for a in answers]
    return {url for url, doc in web.qa.docs.items()
            if any(a in normalize(doc.text) for a in wanted)}  # fmt: skip


def job_pages(
    web: Web, text: str, *, removed: Collection[str] = (), replaced: dict[str, Page] | None = None
) -> tuple[list[str], list[Page]]:
    """Plan, search (without `removed`), fetch (`replaced` pages in their place), index."""
    queries = plan_queries(text, max_queries=MAX_QUERIES)
    limit = max(RESULTS_PER_QUERY, MAX_SOURCES) + min(len(removed), 150)
    lists = [[r for r in _search(web, q, limit) if r.url not in removed] for q in queries]
    pages = []
    for result in merge_results(lists)[:MAX_SOURCES]:
        page = (replaced or {}).get(result.url) or web.page(result.url)
        if page is not None:
            web.index(page)
            pages.append(page)
    return queries, pages


def _search(web: Web, query: str, limit: int) -> list[SearchResult]:
    """One query's results, asked again (up to 3 times) when a loopback read fails under
    load: one dropped connection should not end a run of many minutes."""
    for attempt in range(3):
        try:
            return search_query(web.search, query, limit=limit)
        except ProviderUnavailable:
            if attempt == 2:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def cut_paragraph(web: Web, question: Question) -> dict[str, Page] | None:
    """The question's page without the paragraph holding its answer, or None when the
    extracted text does not hold that paragraph whole."""
    url = next(u for u, d in web.qa.docs.items() if d.id == question.doc_id)
    page, doc = web.page(url), web.qa.docs[url]
    if page is None:
        return None
    for paragraph in doc.text.split("\n\n"):
        if any(a in paragraph for a in question.answers) and paragraph in page.text:
            text = page.text.replace(paragraph, "")
            sha = hashlib.sha256(text.encode()).hexdigest()
            return {url: page.model_copy(update={"text": text, "content_sha256": sha})}
    return None


def run_job(
    web: Web,
    questions: Sequence[Question],
    scenario: str,
    split: str,
    removed: Collection[str] = (),
    replaced: dict[str, Page] | None = None,
) -> tuple[list[Record], dict[int, bool]]:
    """One job at every budget: the coverage bundle's records, and recall as packed
    before (`rank_chunks`, one facet) by budget."""
    text = " ".join(q.question for q in questions)
    queries, pages = job_pages(web, text, removed=removed, replaced=replaced)
    by_sha = {p.content_sha256: p for p in pages}
    facets = split_facets(text)
    stats = BundleStats()
    pools = facet_pools(question=text, facets=facets, pages=by_sha, stats=stats,
                        embedder=web.embedder, store=web.store, top_k=TOP_K,
                        embedding=EmbedSettings()) if pages else [[] for _ in facets]  # fmt: skip
    vectors = vector_lookup(web.store, MODEL)
    records, before = [], {}
    answerable = all(hit(q, [p.text for p in pages]) for q in questions)
    for budget in BUDGETS:
        started = time.perf_counter()
        packed = pack_facets(facets, pools, top_k=TOP_K, token_budget=budget, vectors=vectors)
        bundle = covered_bundle(job_id="bench", question=text, queries=queries, pages=by_sha,
                                facets=facets, pools=pools, packed=packed, failures=[],
                                stats=stats)  # fmt: skip
        if len(questions) == 1 and pages:
            SECONDS["with coverage"] += time.perf_counter() - started
            SECONDS["bundles"] += 1
        untrimmed = pack_facets(facets, pools, top_k=TOP_K, token_budget=budget,
                                vectors=vectors, abstain=False)  # fmt: skip
        records.append(_record(scenario, split, budget, bundle, untrimmed, pools, facets,
                               questions, answerable))  # fmt: skip
        if len(questions) == 1 and pages:
            started = time.perf_counter()
            old = rank_chunks(pools[0], top_k=TOP_K, token_budget=budget, vectors=vectors)
            plain = build_bundle(job_id="bench", question=text, queries=queries, pages=by_sha,
                                 ranked=old, failures=[], stats=stats)  # fmt: skip
            SECONDS["before"] += time.perf_counter() - started
            before[budget] = hit(questions[0], [c.text for c in plain.chunks])
    return records, before


def _record(scenario: str, split: str, budget: int, bundle: Bundle, packed: Packed,
            pools: Sequence[Sequence[ScoredChunk]], facets: Sequence[str],
            questions: Sequence[Question], answerable: bool) -> Record:  # fmt: skip
    assert bundle.coverage is not None
    texts = [c.text for c in bundle.chunks]
    signals, labels = [], []
    ranked, facet_of = packed.ranked, packed.facet_of
    # Signals as pack_facets decided on them: the first packing (one facet: the same).
    for f, facet in enumerate(facets):
        mine = [c for c, of in zip(ranked, facet_of, strict=True) if of == f]
        signals.append(cov.facet_signals(facet, mine, pools[f]).vector())
        label_of = questions[f] if len(questions) == len(facets) else questions[0]
        labels.append(hit(label_of, [c.chunk.text for c in mine]))
    found = sum(f.status != "missing" for f in bundle.coverage.facets)
    return Record(scenario, budget, bundle.coverage.confidence, bundle.coverage.sufficient,
                  all(hit(q, texts) for q in questions), answerable, len(facets), found,
                  signals, labels, split)  # fmt: skip


@dataclass
class Run:
    """Every record of one run, and the recall of the old packing by budget."""

    records: list[Record] = field(default_factory=list)
    before: dict[str, dict[int, int]] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)


def warm(web: Web, questions: Sequence[Question], pairs: Sequence[tuple[Question, Question]]
         ) -> None:  # fmt: skip
    """Fetch and index every page the scenarios will read (the costly part: embedding),
    before anything is packed."""
    for q in questions:
        job_pages(web, q.question)
        job_pages(web, q.question, removed=answer_urls(web, q.answers))
        cut = cut_paragraph(web, q)
        if cut is not None:
            job_pages(web, q.question, replaced=cut)
    for a, b in pairs:
        job_pages(web, f"{a.question} {b.question}")


def use_constants(path: Path) -> None:
    """Take the coverage model's constants from `path` (JSON: coefficients, intercept,
    missing), waiting for it to appear: a run can embed while the model is being fitted."""
    while not path.exists():
        time.sleep(10)
    fitted = json.loads(path.read_text())
    cov.COEFFICIENTS = tuple(fitted["coefficients"])
    cov.INTERCEPT = fitted["intercept"]
    cov.MISSING = fitted["missing"]


def measure(web: Web, questions: Sequence[Question], pairs: Sequence[tuple[Question, Question]],
            split: str, run: Run) -> None:  # fmt: skip
    """Every scenario of `questions` (and the compound `pairs`) into `run`."""
    for n, q in enumerate(questions):
        removed = answer_urls(web, q.answers)
        cut = cut_paragraph(web, q)
        jobs: list[tuple[str, set[str], dict[str, Page] | None]] = [
            ("full", set(), None),
            ("removed", removed, None),
        ]
        if cut is not None:
            jobs.append(("paragraph", set(), cut))
        for scenario, gone, replaced in jobs:
            records, before = run_job(web, [q], scenario, split, gone, replaced)
            run.records += records
            run.jobs[scenario] = run.jobs.get(scenario, 0) + 1
            tally = run.before.setdefault(scenario, {})
            for budget, got in before.items():
                tally[budget] = tally.get(budget, 0) + got
        if n % 20 == 19:
            print(f"  {split}: {n + 1}/{len(questions)} questions", flush=True)  # noqa: T201
    for a, b in pairs:
        records, _ = run_job(web, [a, b], "compound", split)
        run.records += records
        run.jobs["compound"] = run.jobs.get("compound", 0) + 1


def _at(records: Sequence[Record], scenario: str, budget: int) -> list[Record]:
    return [r for r in records if r.scenario == scenario and r.budget == budget]


def abstention_rows(records: Sequence[Record], budget: int) -> list[str]:
    """AUROC and sufficient=false rates at one budget."""
    answered = [r for r in _at(records, "full", budget) if r.holds]
    removed = [r for r in _at(records, "removed", budget) if not r.answerable]
    cut = [r for r in _at(records, "paragraph", budget) if not r.answerable]
    rows = []
    for name, unanswerable in (("answer pages removed", removed),
                               ("answer paragraph removed", cut)):  # fmt: skip
        area = auroc([r.confidence for r in answered], [r.confidence for r in unanswerable])
        rows.append(f"| {budget} | {name} | {area:.3f} | {_flagged(unanswerable)} | "
                    f"{_flagged(answered)} |")  # fmt: skip
    return rows


def _flagged(records: Sequence[Record]) -> str:
    """The share of `records` with sufficient=false, and their count."""
    if not records:
        return "n/a (0)"
    return f"{sum(not r.sufficient for r in records) / len(records):.1%} ({len(records)})"


def report(run: Run, n_questions: int, seconds: float, computed: int) -> str:
    """The docs section: abstention, calibration, compound questions, recall."""
    recs = run.records
    text = (
        f"Report half of shared/data/qa (questions split by page; the coverage model was fitted "
        f"on the other half): {n_questions} questions, each run on the full web, on the web "
        f"without every page holding its answer, and with only its answer's paragraph cut "
        f"({run.jobs.get('paragraph', 0)} of them: where extraction kept that paragraph whole); "
        f"{run.jobs.get('compound', 0)} compound questions (two questions of different pages "
        f'joined "Q1 Q2"). max_sources {MAX_SOURCES}, top_k {TOP_K}, {MODEL}.\n\n'
        "Abstention: AUROC of `coverage.confidence` between bundles holding the answer (full "
        "web) and bundles of a web without it; `sufficient=false` at the shipped threshold "
        "(target >= 90 % of unanswerable, <= 5 % of answered).\n\n"
        "| budget | unanswerable web | AUROC | unanswerable flagged | answered flagged |\n"
        "|---:|---|---:|---:|---:|\n"
    )
    for budget in (1000, COVERAGE_BUDGET):
        text += "\n".join(abstention_rows(recs, budget)) + "\n"
    text += "\nCalibration (every single-question bundle, label: the bundle holds the answer):\n\n"
    text += "| budget | ECE | bundles | reliability (mean confidence -> share holding, n) |\n"
    text += "|---:|---:|---:|---|\n"
    for budget in (1000, COVERAGE_BUDGET):
        single = [r for r in recs if r.budget == budget and r.scenario != "compound"]
        ece, rows = reliability([r.confidence for r in single], [r.holds for r in single])
        curve = "; ".join(f"{m:.2f} -> {a:.2f} ({k})" for _, m, a, k in rows)
        text += f"| {budget} | {ece:.3f} | {len(single)} | {curve} |\n"
    full = {b: _at(recs, "full", b) for b in BUDGETS}
    recall = {b: sum(r.holds for r in full[b]) / max(1, len(full[b])) for b in BUDGETS}
    before = run.before.get("full", {})
    n_full = max(1, run.jobs.get("full", 0))
    text += "\nSingle-question recall, full web, same jobs side by side:\n\n"
    text += "| packing | " + " | ".join(f"{b} tok" for b in BUDGETS) + " |\n"
    text += "|---|" + "---:|" * len(BUDGETS) + "\n"
    text += "| before (rank_chunks, one facet) | " + " | ".join(
        f"{before.get(b, 0) / n_full:.3f}" for b in BUDGETS) + " |\n"  # fmt: skip
    text += "| with coverage (facets, abstention) | " + " | ".join(
        f"{recall[b]:.3f}" for b in BUDGETS) + " |\n"  # fmt: skip
    comp = _at(recs, "compound", 1000)
    if comp:
        both = sum(r.holds for r in comp) / len(comp)
        two = sum(r.facets == 2 for r in comp) / len(comp)
        found = sum(r.facets == 2 and r.facets_found == 2 for r in comp) / len(comp)
        text += (
            f"\nCompound questions at 1,000 tokens: both answers in the bundle {both:.1%} "
            f"(target >= 80 % and >= 0.9 x single recall at 500 squared = "
            f"{0.9 * recall[500] ** 2:.1%}); split into two facets {two:.1%}; two facets "
            f"found (neither missing) {found:.1%} (target >= 90 %).\n"
        )
    bundles = SECONDS["bundles"]
    text += (
        f"\nPacking and bundling time per single-question bundle, same jobs: before "
        f"{SECONDS['before'] / max(1, bundles) * 1000:.1f} ms, with coverage "
        f"{SECONDS['with coverage'] / max(1, bundles) * 1000:.1f} ms (retrieval, shared by "
        "both, not counted).\n"
    )
    text += fit_half_text(OUT / "sufficiency-fit.json")
    text += f"\nCPU: {cpu()}.\n"
    text += (f"\nRun time {seconds:.0f} s ({computed} texts embedded, the rest from the "
             "bench/out/ cache).")  # fmt: skip
    return text


def cpu() -> str:
    """The CPU's model name, cores and vector flags, as /proc/cpuinfo gives them."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                 if ln.startswith("model name")), "unknown")  # fmt: skip
    flags = set(next((ln for ln in info.splitlines() if ln.startswith("flags")), "").split())
    wanted = ("avx2", "avx512_vnni", "avx512_bf16", "amx_bf16")
    have = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in wanted)
    return f"{name}, {os.cpu_count()} cores ({have})"


def draw(questions: Sequence[Question], n: int, seed: int = 0) -> list[Question]:
    return random.Random(seed).sample(list(questions), min(n, len(questions)))


def draw_pairs(questions: Sequence[Question], n: int) -> list[tuple[Question, Question]]:
    """`n` pairs of questions of different pages."""
    rng, out = random.Random(1), list[tuple[Question, Question]]()
    while len(out) < n:
        a, b = rng.sample(list(questions), 2)
        if a.doc_id != b.doc_id:
            out.append((a, b))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=120, help="per half")
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--fit", action="store_true", help="fit on the fit half, print constants")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--refit", action="store_true",
                        help="fit again from the last --fit run's records")  # fmt: skip
    parser.add_argument("--constants", help="a JSON file of fitted constants to use instead")
    args = parser.parse_args()
    if args.refit:
        saved = json.loads((OUT / "sufficiency-fit.json").read_text())["records"]
        print(fit_model([Record(**r) for r in saved]))  # noqa: T201
        return
    loaded = shared_qa()
    if loaded is None:
        return
    docs, questions = loaded
    started = time.perf_counter()
    qa = start_qa_web(docs)
    fetcher = HttpxFetcher(FetchSettings(), policy=AddressPolicy(allowed_networks=["127.0.0.1/32"]))
    embedder = OpenAIEmbedder(base_url=qa.embeddings.url + "/v1", api_key="bench", model=MODEL)
    web = Web(qa, SearxngSearch(qa.search.url), fetcher, embedder)
    run = Run()
    half = "fit" if args.fit else "report"
    mine = [q for q in questions if split_of(q) == half]
    sample = draw(mine, args.questions)
    try:
        pairs = [] if args.fit else draw_pairs(mine, args.pairs)
        if args.constants:
            warm(web, sample, pairs)
            use_constants(Path(args.constants))
        measure(web, sample, pairs, half, run)
    finally:
        fetcher.close()
        qa.stop()
    dump = OUT / f"sufficiency-{half}.json"
    records = [dataclasses.asdict(r) for r in run.records]
    dump.write_text(json.dumps({"records": records}))
    if args.fit:
        print(fit_model(run.records))  # noqa: T201
        return
    text = report(run, len(sample), time.perf_counter() - started, qa.embedder.computed)
    print(text)  # noqa: T201
    if args.write:
        write_section("sufficiency", text)


if __name__ == "__main__":
    main()
