"""How close a research job comes to its critical path, with an embeddings API and with the
local model, side by side in one run (issue #22).

The held-out QA web: the SQuAD pages of shared/data/qa served on loopback, each page on a
loopback address of its own (`--hosts N`: N addresses shared round-robin), so a job's 20
sources are on 20 hosts as the issue measured them (per-host delay off), each answering
after 0.2-2 s (a fixed delay per page, drawn from its path); a SearxNG-compatible BM25
search over them; an OpenAI-compatible embeddings endpoint (webctx.devweb.embeddings,
vectors of all-MiniLM-L6-v2 from the bench/out/ cache) answering each request after 0.3 s.
Questions: held out from bench/answer_recall.py's seeds 0 and 1.

Each job is `webctx research` on the embedded default, cold (a new data directory: no page,
search or embedding cache), timed from the command's start (CLI wall) and by the bundle (job
time, stages). Each question runs three times, each time in a new data directory: once with
the local service started beforehand (`webctx service start`, then its worker ready; the job
time, stages and first CLI wall come from this run), once as the first call, which starts
the service itself (its CLI wall and job time in the "first call" columns), and once through
the HTTP API as an agent's client would call it (`webctx api` and its service started
beforehand, then one `POST /v1/context`, timed from the request to the bundle: the "HTTP
API" columns, without the CLI's interpreter and imports). Paths: the API (OPENAI_BASE_URL
set) and the local model (nothing set: all-MiniLM-L6-v2 in process on the `auto` backend:
OpenVINO bf16 on a CPU that multiplies bf16, AMX or AVX512-BF16, else ONNX Runtime fp32).
The critical path of a job is its slowest page, plus one embeddings round trip on the API
path; the per-host bound is the same with each host's pages on its
`WEBCTX_FETCH__PER_HOST_CONCURRENCY` (2) connections, in the best order (with `--hosts`
below the pages, a job's pages can share a host). Rows with levers (`--levers`, or only
those named `--lever NAME`) set the named WEBCTX_ variables.

    WEBCTX_BENCH_LOCAL_BACKEND=onnx .venv/bin/python bench/latency.py [--questions 5]
        [--levers [--lever NAME ...] [--lever-questions 2]] [--only-levers] [--write]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import itertools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import write_section  # noqa: E402
from bench.answer_recall import draw_samples  # noqa: E402
from bench.qa_web import (  # noqa: E402
    MODEL,
    OUT,
    CachedMiniLM,
    QADoc,
    Question,
    VectorCache,
    _backend_suffix,
    render_html,
    shared_qa,
)
from bench.recall_scoring import hit  # noqa: E402
from webctx.devweb.embeddings import make_embeddings_app  # noqa: E402
from webctx.devweb.searxng import SearchDoc, make_searxng_app  # noqa: E402
from webctx.devweb.server import LoopbackServer  # noqa: E402
from webctx.devweb.site import SitePage, make_site_app  # noqa: E402
from webctx.models import Bundle, Download  # noqa: E402
from webctx.settings import ChunkSettings, FetchSettings  # noqa: E402
from webctx.stages.chunk import chunk_page  # noqa: E402
from webctx.stages.fetch import extract_page  # noqa: E402
from workers.service_client import stop_service  # noqa: E402

EMBED_LATENCY_S = 0.3
TOKEN_BUDGET = 1000
STAGES = ("plan", "search", "fetch", "embed", "store", "rank")
PER_HOST_CONCURRENCY = FetchSettings().per_host_concurrency


def page_delay(path: str) -> float:
    """A page's fixed delay, 0.2-2 s, drawn from its path."""
    draw = int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], "big") / 0xFFFFFFFF
    return round(0.2 + 1.8 * draw, 3)


@dataclass
class LatencyWeb:
    """The site on its loopback addresses, the search and the embeddings endpoint."""

    sites: list[LoopbackServer]
    search: LoopbackServer
    embeddings: LoopbackServer
    hits: collections.Counter[str]
    delays: dict[str, float] = field(default_factory=dict)  # url -> delay
    hosts: dict[str, int] = field(default_factory=dict)  # url path -> host number

    def stop(self) -> None:
        """Stop every server."""
        for server in (*self.sites, self.search, self.embeddings):
            server.stop()


def warm_vectors(docs: Sequence[QADoc], model: CachedMiniLM,
                 questions: Sequence[Question] = ()) -> int:  # fmt: skip
    """Every chunk of every page, and the questions, into the vector cache before any job,
    so the endpoint answers in its 0.3 s instead of computing on the machine the jobs run
    on (or loading the model inside a job); how many vectors were computed."""
    before = model.computed
    if questions:
        model.embed([q.question for q in questions])
    size, overlap = ChunkSettings().max_tokens, ChunkSettings().overlap_tokens
    for d in docs:
        download = Download(url="http://127.0.1.1" + d.url_path,
                            final_url="http://127.0.1.1" + d.url_path,
                            status=200, content_type="text/html; charset=utf-8",
                            body=render_html(d).encode())  # fmt: skip
        chunks = chunk_page(extract_page(download), max_tokens=size, overlap_tokens=overlap)
        if chunks:
            model.embed([c.text for c in chunks])
    return model.computed - before


def start_web(docs: Sequence[QADoc], hosts: int, questions: Sequence[Question] = ()) -> LatencyWeb:
    """Every page on every one of `hosts` loopback addresses (each search result names one
    host per page, round-robin); the questions' vectors are cached ahead too."""
    if not 1 <= hosts <= 254:
        raise SystemExit("--hosts: 1 to 254 (addresses 127.0.1.1-254)")
    hits: collections.Counter[str] = collections.Counter()
    pages = {d.url_path: SitePage(body=render_html(d), delay_s=page_delay(d.url_path))
             for d in docs}  # fmt: skip
    sites = [LoopbackServer(make_site_app(pages, hits=hits), host=f"127.0.1.{n + 1}").start()
             for n in range(hosts)]  # fmt: skip
    search_docs, delays, host_of = [], {}, {}
    for n, d in enumerate(docs):
        url = sites[n % hosts].url + d.url_path
        search_docs.append(SearchDoc(url, d.title, d.text))
        delays[d.url_path] = page_delay(d.url_path)
        host_of[d.url_path] = n % hosts
    search = LoopbackServer(make_searxng_app(search_docs)).start()
    model = CachedMiniLM(VectorCache(OUT / f"qa-vectors-{MODEL}{_backend_suffix()}.bin"))
    print(f"vectors computed ahead: {warm_vectors(docs, model, questions)}", flush=True)  # noqa: T201
    embeddings = LoopbackServer(
        make_embeddings_app(
            lambda texts: model.embed(texts).vectors,
            model=MODEL,
            rpm=None,
            tpm=None,
            latency_s=EMBED_LATENCY_S,
        )  # fmt: skip
    ).start()
    return LatencyWeb(sites, search, embeddings, hits, delays, host_of)


def host_bound(delays: Sequence[float], slots: int) -> float:
    """The least time one host's pages take on `slots` connections (every assignment of
    pages to connections; a host holds a handful of a job's pages)."""
    if not delays:
        return 0.0
    best = float("inf")
    for assignment in itertools.product(range(slots), repeat=len(delays)):
        loads = [0.0] * slots
        for delay, slot in zip(delays, assignment, strict=True):
            loads[slot] += delay
        best = min(best, max(loads))
    return best


def per_host_bound(web: LatencyWeb, slots: int) -> float:
    """The slowest host's pages of the last job on `slots` connections each."""
    by_host: dict[int, list[float]] = collections.defaultdict(list)
    for path in web.hits:
        if path in web.delays:
            by_host[web.hosts[path]].append(web.delays[path])
    return max((host_bound(d, slots) for d in by_host.values()), default=0.0)


def _env(web: LatencyWeb, *, api: bool, data: Path, extra: dict[str, str]) -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE dropped too: an installed webctx has its bytecode compiled,
    # and without the cache every CLI call and service start compiles webctx anew (~0.07 s
    # of the CLI's ~0.5 s of imports).
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WEBCTX_", "CELERY_", "OPENAI_")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(
        PYTHONPATH=str(ROOT),
        WEBCTX_DATA_DIR=str(data),
        WEBCTX_SEARCH_PROVIDER="searxng",
        WEBCTX_SEARXNG_URL=web.search.url,
        WEBCTX_ALLOWED_NETWORKS="127.0.1.0/24,127.0.0.1/32",
        WEBCTX_FETCH__PER_HOST_DELAY_S="0",
    )
    if api:
        env.update(OPENAI_BASE_URL=web.embeddings.url + "/v1", OPENAI_API_KEY="bench",
                   WEBCTX_EMBEDDING_MODEL=MODEL)  # fmt: skip
    env.update(extra)
    return env


@dataclass
class Run:
    """One job's numbers."""

    wall: float
    job: float
    critical: float
    bound: float
    stages: dict[str, float]
    chunks: int
    tokens: int
    requests: int
    hit: bool
    first_wall: float = 0.0
    first_job: float = 0.0
    http_wall: float = 0.0
    http_job: float = 0.0
    ahead: int = 0
    at_rank: int = 0


def run_job(web: LatencyWeb, question: Question, sources: int, env: dict[str, str],
            *, api: bool) -> Run:  # fmt: skip
    """One cold `webctx research` job."""
    web.hits.clear()
    cmd = [sys.executable, "-m", "webctx.cli", "research", question.question, "--max-sources",
           str(sources), "--token-budget", str(TOKEN_BUDGET), "--top-k", "200"]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"job failed: {done.stderr[-3000:]}")
    bundle = Bundle.model_validate_json(done.stdout)
    slowest = max((web.delays.get(p, 0.0) for p in web.hits), default=0.0)
    rtt = EMBED_LATENCY_S if api else 0.0
    slots = int(env.get("WEBCTX_FETCH__PER_HOST_CONCURRENCY", PER_HOST_CONCURRENCY))
    s = bundle.stats
    return Run(wall=wall, job=s.elapsed_s or 0.0, critical=slowest + rtt,
               bound=per_host_bound(web, slots) + rtt,
               stages=dict(s.stage_s), chunks=s.chunks, tokens=s.tokens_embedded,
               requests=s.embed_requests, ahead=s.embedded_ahead, at_rank=s.embedded_at_rank,
               hit=hit(question, [c.text for c in bundle.chunks]))  # fmt: skip


def start_service(env: dict[str, str], data: Path, *, timeout_s: float = 60.0) -> None:
    """`webctx service start` for the data directory, then wait until its worker consumes
    (the command returns once the service's Valkey answers, before its worker is ready)
    and the service is idle (what it loads in the background once ready, such as the
    embeddings client, is loaded), as a service running for a while would be."""
    cmd = [sys.executable, "-m", "webctx.cli", "service", "start"]
    done = subprocess.run(cmd, env=env, capture_output=True, check=False, cwd=ROOT, text=True)
    if done.returncode != 0:
        log = data / "service.log"
        raise SystemExit(f"webctx service start: exit {done.returncode}: {done.stderr[-2000:]}\n"
                         f"{log.read_text()[-3000:] if log.exists() else ''}")  # fmt: skip
    pid = int(json.loads(done.stdout)["pid"])
    log, deadline = data / "service.log", time.monotonic() + timeout_s
    while b" ready." not in (log.read_bytes() if log.exists() else b""):
        if time.monotonic() > deadline:
            raise SystemExit(f"the local service was not ready in {timeout_s:g} s")
        time.sleep(0.02)
    busy = _cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _cpu_s(pid)
        if now - busy < 0.02:  # under 8% of a core for a quarter second: idle
            return
        busy = now


def run_http(question: Question, sources: int, env: dict[str, str], data: Path,
             *, timeout_s: float = 60.0) -> tuple[float, float]:  # fmt: skip
    """The same job through the HTTP API, as an agent's client calls it: `webctx api`
    started beforehand (with its local service ready and one request served), then one
    `POST /v1/context`, timed from the request to the bundle; (wall, job time)."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server_env = {**env, "WEBCTX_API_AUTH": "disabled"}
    cmd = [sys.executable, "-m", "webctx.cli", "api", "--host", "127.0.0.1", "--port", str(port)]
    with (data.parent / f"{data.name}-api.log").open("wb") as log:
        server = subprocess.Popen(cmd, env=server_env, cwd=ROOT, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=timeout_s + 30) as client:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("webctx api did not start")
                time.sleep(0.05)
            start_service(server_env, data)
            client.get("/v1/jobs/0")  # one request served: the app's routes are warm
            body = {"question": question.question, "max_sources": sources, "top_k": 200,
                    "token_budget": TOKEN_BUDGET, "timeout_s": timeout_s}  # fmt: skip
            started = time.perf_counter()
            answer = client.post("/v1/context", json=body)
            wall = time.perf_counter() - started
        if answer.status_code != 200:
            raise SystemExit(f"POST /v1/context: {answer.status_code} {answer.text[:2000]}")
        bundle = Bundle.model_validate_json(answer.content)
        return wall, bundle.stats.elapsed_s or 0.0
    finally:
        server.terminate()
        server.wait(timeout=30)


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop_service(data: Path) -> None:
    """The job's local service: it outlives the command (idle timeout) and, after a
    first-pass job, goes on embedding the deferred chunks for the index, which would
    take CPU from the next job."""
    stop_service(data)


@dataclass(frozen=True)
class Config:
    """A row: the path, the sources, and lever settings."""

    name: str
    api: bool
    sources: int
    extra: tuple[tuple[str, str], ...] = ()


def measure(web: LatencyWeb, questions: Sequence[Question], config: Config, tmp: Path) -> list[Run]:
    """The config's job for each question, twice, each time in a new data directory: with
    the service started beforehand, then as the first call (which starts it)."""
    runs = []
    for n, question in enumerate(questions):
        data = tmp / f"{abs(hash(config))}-{n}"
        env = _env(web, api=config.api, data=data, extra=dict(config.extra))
        try:
            start_service(env, data)
            run = run_job(web, question, config.sources, env, api=config.api)
        finally:
            _stop_service(data)
        first_data = tmp / f"{abs(hash(config))}-{n}-first"
        env = _env(web, api=config.api, data=first_data, extra=dict(config.extra))
        try:
            first = run_job(web, question, config.sources, env, api=config.api)
        finally:
            _stop_service(first_data)
        run.first_wall, run.first_job = first.wall, first.job
        http_data = tmp / f"{abs(hash(config))}-{n}-http"
        env = _env(web, api=config.api, data=http_data, extra=dict(config.extra))
        try:
            run.http_wall, run.http_job = run_http(question, config.sources, env, http_data)
        finally:
            _stop_service(http_data)
        runs.append(run)
        print(f"  {config.name} q{n}: wall {run.wall:.2f} job {run.job:.2f} critical "  # noqa: T201
              f"{run.critical:.2f} per-host bound {run.bound:.2f} "
              f"rank {run.stages.get('rank', 0):.2f} ahead {run.ahead} at rank {run.at_rank}; "
              f"first call: wall "
              f"{run.first_wall:.2f} job {run.first_job:.2f}; HTTP API: wall "
              f"{run.http_wall:.2f} job {run.http_job:.2f}", flush=True)  # fmt: skip
    return runs


def row(config: Config, runs: Sequence[Run]) -> str:
    """The config's medians as a table row."""

    def med(values: Sequence[float]) -> float:
        return statistics.median(values)

    critical, job, wall = (
        med([r.critical for r in runs]),
        med([r.job for r in runs]),
        med([r.wall for r in runs]),
    )
    ratio = med([r.job / r.critical for r in runs])
    bound = med([r.bound for r in runs])
    first_wall, first_job = med([r.first_wall for r in runs]), med([r.first_job for r in runs])
    http_wall = med([r.http_wall for r in runs])
    stages = " | ".join(f"{med([r.stages.get(s, 0.0) for r in runs]):.2f}" for s in STAGES)
    return (
        f"| {config.name} | {config.sources} | {critical:.2f} | {bound:.2f} | {job:.2f} | "
        f"{ratio:.2f} | {med([r.job / r.bound for r in runs]):.2f} | {wall:.2f} | "
        f"{wall - critical:+.2f} | {http_wall:.2f} | {http_wall - critical:+.2f} | "
        f"{med([r.http_job for r in runs]):.2f} | {first_wall:.2f} | {first_job:.2f} | "
        f"{stages} | {med([r.chunks for r in runs]):.0f} | "
        f"{med([r.tokens for r in runs]):,.0f} | {med([r.requests for r in runs]):.0f} | "
        f"{med([r.ahead for r in runs]):.0f} / {med([r.at_rank for r in runs]):.0f} | "
        f"{sum(r.hit for r in runs)}/{len(runs)} |"
    )


HEADER = (
    "| path | sources | critical path s | per-host bound s | job s | job / critical "
    "| job / bound | CLI wall s | wall - critical | HTTP API wall s | HTTP wall - critical "
    "| HTTP API: job s | first call: CLI wall s | first call: job s "
    "| plan | search | fetch | embed | store | rank | chunks | tokens embedded | embed requests "
    "| chunks embedded ahead / at rank | answer in bundle |\n" + "|---" * 25 + "|"
)
MAIN = [Config("API", True, 8), Config("API", True, 20), Config("local model", False, 8),
        Config("local model", False, 20)]  # fmt: skip
OFF, ONNX = (("WEBCTX_PREFILTER__WHEN", "never"),), (("WEBCTX_EMBED__LOCAL_BACKEND", "onnx"),)
INT8 = (("WEBCTX_EMBED__LOCAL_BACKEND", "onnx-int8"),)
NARROW_OFF = ("WEBCTX_PREFILTER__EMBED_BUDGET_S", "0")
SLOW = (*ONNX, ("WEBCTX_EMBED__LOCAL_THREADS", "1"))  # no bf16 nor VNNI: slower than here
LEVERS = [
    Config("API, first pass always", True, 20, (("WEBCTX_PREFILTER__WHEN", "always"),)),
    Config("API, 8 task threads", True, 20, (("WEBCTX_WORKER_CONCURRENCY", "8"),)),
    Config("local model, no first pass", False, 8, OFF),
    Config("local model, no page embedded ahead", False, 8, (("WEBCTX_PREFILTER__AHEAD", "0"),)),
    Config("local model, 8 task threads", False, 20, (("WEBCTX_WORKER_CONCURRENCY", "8"),)),
    Config("local model int8", False, 20, INT8),
    Config("local model, ONNX Runtime fp32", False, 8, ONNX),
    Config("local model, ONNX Runtime fp32", False, 20, ONNX),
    Config("local model int8", False, 8, INT8),
    Config("local model, slow CPU (fp32, 1 thread)", False, 8, SLOW),
    Config("local model, slow CPU, never narrowed", False, 8, (*SLOW, NARROW_OFF)),
]  # fmt: skip


def load() -> str:
    """The machine's load averages and cores, as /proc reports them."""
    averages = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return f"load average {averages} on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--levers", action="store_true", help="also the lever rows")
    parser.add_argument("--lever-questions", type=int, default=2)
    parser.add_argument("--lever", action="append", default=[], metavar="NAME",
                        help="only lever rows whose name contains NAME (repeatable)")  # fmt: skip
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--only-levers", action="store_true", help="lever rows alone, unwritten")
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="loopback hosts the pages are spread over (default: one per page)",
    )
    args = parser.parse_args()
    loaded = shared_qa()
    if loaded is None:
        return
    docs, questions = loaded
    seen = {q.id for qs in draw_samples(questions, [0, 1], 200).values() for q in qs}
    held_out = random.Random(22).sample([q for q in questions if q.id not in seen], args.questions)
    hosts = args.hosts or len(docs)
    web = start_web(docs, hosts, held_out)
    loads = [load()]
    results: list[tuple[Config, list[Run]]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="webctx-latency-") as tmp:
            levers = [c for c in LEVERS if not args.lever or any(n in c.name for n in args.lever)]
            configs = [] if args.only_levers else list(MAIN)
            configs += levers if args.levers or args.only_levers else []
            for config in configs:
                asked = held_out if config in MAIN else held_out[: args.lever_questions]
                results.append((config, measure(web, asked, config, Path(tmp))))
                loads.append(load())
    finally:
        web.stop()
    main_rows = "\n".join(row(c, r) for c, r in results if c in MAIN)
    text = (
        f"Median of {args.questions} held-out questions per row (lever rows: "
        f"{args.lever_questions}), each job cold (`webctx research`, embedded default, new "
        f"data directory, the service started beforehand; the first call's columns: "
        f"started by the command; the HTTP API's: one `POST /v1/context` to a `webctx api` "
        f"started beforehand), token budget {TOKEN_BUDGET}; pages on {hosts} loopback hosts "
        f"({'one per page' if hosts == len(docs) else 'shared round-robin'}), "
        f"0.2-2 s each; embeddings endpoint {EMBED_LATENCY_S} s per request. Measured under "
        f"{loads[0]} at the start and {loads[-1]} at the end (the machine is shared: "
        "compare rows of this run, not absolute seconds). Stage seconds overlap.\n\n"
        + (f"{HEADER}\n{main_rows}\n" if main_rows else "")
    )
    if args.levers or args.only_levers:
        lever_rows = "\n".join(row(c, r) for c, r in results if c not in MAIN)
        text += (
            f"\nLevers (one setting changed from the defaults above):\n\n{HEADER}\n{lever_rows}\n"
        )
    print(text)  # noqa: T201
    if args.write and not args.only_levers:  # the section leads with the main rows
        write_section("latency", text)


if __name__ == "__main__":
    main()
