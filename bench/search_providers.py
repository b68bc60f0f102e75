"""Search providers side by side on the QA web: answer recall and job time per provider,
a flaky first provider alone and in a chain, and pages that fail to download with and
without a provider's page text.

The QA web of bench/answer_recall.py (shared/data/qa: SQuAD pages served as HTML) with one
loopback fake per vendor (webctx/devweb/vendors.py: each vendor's request and answer
format over the same BM25 ranking of the pages, the ranking the SearxNG fake uses) and the
real adapters over HTTP. Every fake answers after `--latency-ms` (the same for all: a
stand-in for a search API's answer time, not a vendor's measured one). Per question, as
a job runs it: `plan_queries`, the queries searched at once (one task each), a failed
query retried as the task would (after the provider's retry-after, else 2 s doubling, 5
times at most), `merge_results`, the first 8 sources downloaded at once (`fetch_page`,
HttpxFetcher), a download that fails in transit replaced by the provider's text when it
has one (webctx.jobs.provider_copy), then chunk, embed and rank with the hashed embedder
(`index_page`, `answer_question`'s two steps). Recall: share of questions whose bundle holds
an answer string at 1000 and 4000 tokens, and whose fetched pages hold one (sources).

    .venv/bin/python bench/search_providers.py [--questions 100] [--latency-ms 300] [--write]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import write_section  # noqa: E402
from bench.answer_recall import index_pages, run_webctx  # noqa: E402
from bench.qa_web import QADoc, QAWeb, Question, shared_qa, start_qa_web  # noqa: E402
from bench.recall_scoring import Job, Tally, hit  # noqa: E402
from webctx.adapters.brave_search import BraveSearch  # noqa: E402
from webctx.adapters.exa_search import ExaSearch  # noqa: E402
from webctx.adapters.hash_embedder import HashEmbedder  # noqa: E402
from webctx.adapters.httpx_fetcher import HttpxFetcher  # noqa: E402
from webctx.adapters.searxng_search import SearxngSearch  # noqa: E402
from webctx.adapters.serper_search import SerperSearch  # noqa: E402
from webctx.adapters.tavily_search import TavilySearch  # noqa: E402
from webctx.devweb.searxng import SearchDoc, make_searxng_app  # noqa: E402
from webctx.devweb.server import LoopbackServer  # noqa: E402
from webctx.devweb.vendors import VENDORS, VendorControl, make_vendor_app, vendor_control  # noqa: E402
from webctx.errors import FetchError, RateLimited, TransientError, WebctxError  # noqa: E402
from webctx.jobs.provider_copy import provider_page, transport_failure  # noqa: E402
from webctx.models import Failure, Page, SearchResult  # noqa: E402
from webctx.net.addresses import AddressPolicy  # noqa: E402
from webctx.protocols import SearchProvider  # noqa: E402
from webctx.settings import FetchSettings  # noqa: E402
from webctx.stages.fetch import fetch_page  # noqa: E402
from webctx.stages.plan import plan_queries  # noqa: E402
from webctx.stages.search import merge_results, search_query  # noqa: E402
from webctx.stages.search_chain import SearchChain  # noqa: E402

KEY = "bench-key"
MAX_SOURCES, MAX_QUERIES, LIMIT = 8, 4, 10
RETRIES, BACKOFF_S = 5, 2.0  # WEBCTX_TASK_MAX_RETRIES, WEBCTX_TASK_RETRY_BACKOFF_S
DOWN_SHARE = 0.2
"""Share of the pages that answer 503 in the download-failure rows."""


@dataclass
class Fakes:
    """One loopback server per provider over the QA web's pages."""

    servers: dict[str, LoopbackServer]
    controls: dict[str, VendorControl]

    def provider(self, name: str) -> SearchProvider:
        url = self.servers[name].url
        made: dict[str, Callable[[], SearchProvider]] = {
            "searxng": lambda: SearxngSearch(url), "brave": lambda: BraveSearch(KEY, base_url=url),
            "tavily": lambda: TavilySearch(KEY, base_url=url),
            "exa": lambda: ExaSearch(KEY, base_url=url),
            "serper": lambda: SerperSearch(KEY, base_url=url)}  # fmt: skip
        return made[name]()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def start_fakes(web: QAWeb, latency_s: float) -> Fakes:
    docs = [SearchDoc(url, d.title, d.text) for url, d in web.docs.items()]
    servers = {"searxng": LoopbackServer(make_searxng_app(docs, latency_s=latency_s)).start()}
    controls = {}
    for vendor in VENDORS:
        app = make_vendor_app(vendor, docs, api_key=KEY, latency_s=latency_s)
        servers[vendor], controls[vendor] = LoopbackServer(app).start(), vendor_control(app)
    return Fakes(servers, controls)


@dataclass
class Row:
    """One scenario's tallies and timings."""

    name: str
    tally: Tally = field(default_factory=Tally)
    sources_hit: int = 0
    job_s: list[float] = field(default_factory=list)
    failed_queries: int = 0
    retries: int = 0
    from_provider: int = 0
    failed_pages: int = 0


def _search(search: SearchProvider, query: str, row: Row) -> list[SearchResult]:
    """One query as its task runs it: retried after a transient failure, then failed."""
    for attempt in range(RETRIES + 1):
        try:
            return search_query(search, query, limit=LIMIT)
        except TransientError as exc:
            if attempt == RETRIES:
                break
            row.retries += 1
            wait = exc.retry_after if isinstance(exc, RateLimited) else None
            time.sleep(wait if wait is not None else BACKOFF_S * 2**attempt)
        except WebctxError:
            break
    row.failed_queries += 1
    return []


def _page(fetcher: HttpxFetcher, result: SearchResult, row: Row) -> Page | Failure:
    try:
        return fetch_page(result.url, fetcher)
    except FetchError as exc:
        copy = provider_page(result, result.url) if transport_failure(exc) else None
        if copy is not None:
            row.from_provider += 1
            return copy
        row.failed_pages += 1
        return Failure(url=result.url, stage="fetch", error=str(exc), reason=exc.reason)


def run_row(row: Row, search: SearchProvider, questions: Sequence[Question]) -> list[Job]:
    """Every question's job: its queries at once, then its sources at once."""
    fetcher = HttpxFetcher(FetchSettings(per_host_delay_s=0.0),
                           policy=AddressPolicy(allowed_networks=["127.0.0.1/32"]))  # fmt: skip
    jobs = []
    with ThreadPoolExecutor(MAX_SOURCES) as pool:
        for question in questions:
            started = time.perf_counter()
            queries = plan_queries(question.question, max_queries=MAX_QUERIES)
            lists = list(pool.map(lambda q: _search(search, q, row), queries))
            merged = merge_results(lists)[:MAX_SOURCES]
            got = list(pool.map(lambda r: _page(fetcher, r, row), merged))
            row.job_s.append(time.perf_counter() - started)
            pages = [p for p in got if isinstance(p, Page)]
            jobs.append(Job(question, queries, pages, [f for f in got if isinstance(f, Failure)]))
    fetcher.close()
    embedder = HashEmbedder()
    run_webctx(jobs, embedder, index_pages(jobs, embedder), row.tally, None)
    row.sources_hit = sum(hit(j.question, [p.text for p in j.pages]) for j in jobs)
    return jobs


def scenarios(fakes: Fakes) -> list[tuple[str, SearchProvider, Callable[[], None]]]:
    """(row name, search, arrange the fakes) in run order."""
    brave = fakes.controls["brave"]

    def healthy() -> None:
        for control in fakes.controls.values():
            control.recover()

    def flaky() -> None:
        healthy()
        brave.fail_every(2, fault="server")

    rows: list[tuple[str, SearchProvider, Callable[[], None]]] = [
        (name, fakes.provider(name), healthy) for name in ("searxng", *VENDORS)
    ]
    rows += [
        ("brave failing 1 call in 2, alone", fakes.provider("brave"), flaky),
        ("brave failing 1 call in 2, then tavily (chain)",
         SearchChain([fakes.provider("brave"), fakes.provider("tavily")]), flaky),
        ("brave failing 1 call in 2, then searxng (chain)",
         SearchChain([fakes.provider("brave"), fakes.provider("searxng")]), flaky),
    ]  # fmt: skip
    return rows


def measure(docs: Sequence[QADoc], questions: Sequence[Question], latency_s: float) -> list[Row]:
    rows: list[Row] = []
    for down_share in (0.0, DOWN_SHARE):
        down = set(random.Random(7).sample([d.url_path for d in docs],
                                           int(len(docs) * down_share)))  # fmt: skip
        web = start_qa_web(docs, down=down)
        fakes = start_fakes(web, latency_s)
        try:
            plan = (
                scenarios(fakes)
                if not down
                else [
                    (name, fakes.provider(name), lambda: None)
                    for name in ("brave", "tavily", "exa")
                ]
            )
            for name, search, arrange in plan:
                arrange()
                label = name if not down else f"{name}, {down_share:.0%} of pages answering 503"
                row = Row(label)
                run_row(row, search, questions)
                rows.append(row)
                print(line(row, len(questions)), flush=True)  # noqa: T201
        finally:
            fakes.stop()
            web.stop()
    return rows


def line(row: Row, n: int) -> str:
    p95 = sorted(row.job_s)[max(0, -(-len(row.job_s) * 95 // 100) - 1)]
    return (f"| {row.name} | {row.sources_hit / n:.3f} | {row.tally.hits.get(1000, 0) / n:.3f} | "
            f"{row.tally.hits.get(4000, 0) / n:.3f} | {statistics.mean(row.job_s):.2f} | "
            f"{p95:.2f} | {row.failed_queries} | {row.retries} | {row.from_provider} | "
            f"{row.failed_pages} |")  # fmt: skip


def report(rows: Sequence[Row], n: int, latency_ms: int, cpu: str, seconds: float) -> str:
    """The docs section: the results table first, then how they were reached."""
    head = ("| search | recall, sources | recall, 1000 tok | recall, 4000 tok | job s, mean | "
            "job s, p95 | queries failed | query retries | pages from provider text | "
            "pages failed |\n|---|" + "---:|" * 9)  # fmt: skip
    return (
        f"{head}\n" + "\n".join(line(r, n) for r in rows) + "\n\n"
        f"{n} questions of shared/data/qa (seed 0), {MAX_QUERIES} queries and {MAX_SOURCES} "
        f"sources per question, every search fake answering after {latency_ms} ms (the same "
        "for all: not a vendor's measured time); a failing provider answers 500 to every "
        "second request; in the last rows a fixed fifth of the pages answer 503. Job time: "
        "plan, the queries at once, retries as the task makes them, the sources downloaded at "
        "once. Recall with the hashed embedder (lexical ranking: the providers differ in the "
        f"sources, which 'recall, sources' measures). CPU: {cpu}. Run time {seconds:.0f} s.\n"
    )


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                 if ln.startswith("model name")), "unknown")  # fmt: skip
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    shown = [f for f in ("avx2", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return f"{name} ({', '.join(shown) or 'no avx2'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--latency-ms", type=int, default=300)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    loaded = shared_qa()
    if loaded is None:
        return
    docs, all_questions = loaded
    questions = random.Random(0).sample(all_questions, min(args.questions, len(all_questions)))
    started = time.perf_counter()
    rows = measure(docs, questions, args.latency_ms / 1000)
    text = report(rows, len(questions), args.latency_ms, cpu_name(), time.perf_counter() - started)
    print(text)  # noqa: T201
    if args.write:
        write_section("search_providers", text)


if __name__ == "__main__":
    main()
