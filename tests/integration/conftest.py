"""Fixtures of the API and MCP tests: a paced loopback web (every page takes a moment,
so a job can be cancelled mid-fetch), and one API stack per module: the test Redis, a
`webctx worker` and a `webctx api` process on an ephemeral port, keys for two tenants."""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import trafilatura

from tests.conftest import ROOT, CliProcess, WorkerProcess, clean_env, redis_url, run_cli
from tests.testweb import MODEL, LoopbackWeb
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.demo.web import load_corpus
from webctx.devweb.embeddings import make_embeddings_app
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.jobs.tenants import TenantStore

PAGE_DELAY_S = 0.3


def start_paced_web(
    delay_s: float = PAGE_DELAY_S, *, trickle: bool = False, embed_latency_s: float = 0.0
) -> LoopbackWeb:
    """The demo corpus, each page answered after `delay_s` (`trickle`: its body sent a few
    bytes at a time over `delay_s`), with search and embeddings (each request answered
    after `embed_latency_s`)."""
    corpus = load_corpus()
    hits: collections.Counter[str] = collections.Counter()
    pages = {p.path: _paced(p.html, delay_s, trickle=trickle) for p in corpus}
    site = LoopbackServer(make_site_app(pages, hits=hits)).start()
    docs = [
        SearchDoc(site.url + p.path, p.title, trafilatura.extract(p.html) or "", p.published)
        for p in corpus
    ]
    search = LoopbackServer(make_searxng_app(docs)).start()
    embed = HashEmbedder(model=MODEL).vectors
    app = make_embeddings_app(embed, model=MODEL, rpm=None, tpm=None, latency_s=embed_latency_s)
    embeddings = LoopbackServer(app).start()
    return LoopbackWeb(site=site, search=search, embeddings=embeddings, hits=hits)


def _paced(html: str, seconds: float, *, trickle: bool) -> SitePage:
    if not trickle:
        return SitePage(body=html, delay_s=seconds)
    size = -(-len(html.encode()) // TRICKLE_PIECES)
    return SitePage(body=html, trickle_s=seconds / TRICKLE_PIECES, trickle_bytes=size)


TRICKLE_PIECES = 40
"""A trickled page comes in this many pieces, evenly apart (a read never waits long)."""


def free_port() -> int:
    """A port the OS just handed out (released for the server to take)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ApiProcess(CliProcess):
    """`webctx api` on an ephemeral loopback port."""

    kind = "api"

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(env, ["api", "--port", str(self.port)], log=log)

    def ready(self) -> bool:
        """True once /healthz answers 200."""
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False


@dataclass
class ApiStack:
    """A running API with a worker behind it, and one key per tenant."""

    url: str
    web: LoopbackWeb
    env: dict[str, str]
    keys: dict[str, str]

    def client(self, tenant: str = "alpha") -> httpx.Client:
        """An HTTP client authenticated as `tenant`."""
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def paced_web() -> Iterator[LoopbackWeb]:
    """A paced loopback web for one test module."""
    web = start_paced_web()
    yield web
    web.stop()


@pytest.fixture(scope="module")
def api_stack(
    request: pytest.FixtureRequest,
    paced_web: LoopbackWeb,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ApiStack]:
    """The test Redis (flushed at start and end), one worker, the API, two tenants' keys.

    A test module may set `API_ENV` (a dict) to add settings to both processes.
    """
    tmp = tmp_path_factory.mktemp("api")
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    env = clean_env(
        **paced_web.env(),
        **getattr(request.module, "API_ENV", {}),
        CELERY_BROKER_URL=redis_url(),
        WEBCTX_QDRANT_PATH=str(tmp / "q"),
    )
    worker = WorkerProcess(env, "-c", "4", log=tmp / "worker.log")
    api = ApiProcess(env, tmp / "api.log")
    try:
        worker.wait_ready(timeout_s=90)  # generous: CI machines are shared
        api.wait_ready(timeout_s=90)
        # In-process (test_api covers `webctx keys create`): saves two CLI start-ups.
        store = TenantStore(client)
        # Polling tests on a loaded machine outrun the default 120 requests a minute; the
        # limit itself is tested on a key of its own.
        keys = {t: store.create_key(t, rate_limit=100_000)[0] for t in ("alpha", "beta")}
        yield ApiStack(url=api.url, web=paced_web, env=env, keys=keys)
    finally:
        api.stop()
        worker.stop()
        client.flushdb()
        client.close()


PRIORITY_TOPICS = ["SEI layer growth", "lithium plating cold charging", "calendar vs cycle ageing",
                   "particle cracking layered oxide cathodes", "electrolyte decomposition gassing",
                   "LFP versus NMC ageing"]  # fmt: skip


def items_after_a_research_job(
    env: dict[str, str], tmp: Path, client: redis.Redis, start_worker: Callable[..., object]
) -> tuple[int, dict[str, float]]:
    """Queue six batch items, then a research job, then start one worker thread: how many
    items finished after the research job, and every job's finish time."""
    questions = tmp / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q-{i}", "question": q}) + "\n"
                                 for i, q in enumerate(PRIORITY_TOPICS)))  # fmt: skip
    submitted = run_cli(env, "batch", "submit", str(questions), "--name", "f", "--max-sources", "2")
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    batch_id = submitted.stdout.strip()
    research = run_cli(env, "research", "second-life EV packs in stationary storage",
                       "--max-sources", "2", "--no-wait")  # fmt: skip
    assert research.returncode == 0, research.stderr[-3000:]
    job_id = research.stdout.strip()
    start_worker(env, "-c", "1")
    jobs = [job_id, *(f"{batch_id}-{i}" for i in range(len(PRIORITY_TOPICS)))]
    finished: dict[str, float] = {}
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and len(finished) < len(jobs):
        for job in jobs:
            at = client.hget(f"webctx:job:{job}:meta", "finished_at")
            if at:
                finished[job] = float(at)
        time.sleep(0.3)
    assert len(finished) == len(jobs), finished
    assert client.hget(f"webctx:job:{job_id}:meta", "status") == "succeeded"
    return sum(at > finished[job_id] for at in finished.values()), finished


@dataclass
class NodeClients:
    """Node 22 with the TypeScript SDK and the MCP Inspector (scripts/mcp-clients)."""

    node: str
    modules: Path

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`node ARGS` with the clients' modules on NODE_PATH, a throwaway HOME."""
        home = self.modules.parent / "home"
        home.mkdir(exist_ok=True)
        full = clean_env(NODE_PATH=str(self.modules), HOME=str(home), NO_COLOR="1",
                         MCP_INSPECTOR_SECRET_STORE="memory", **env)  # fmt: skip
        return subprocess.run([self.node, *args], env=full, capture_output=True, text=True,
                              timeout=180, check=False)  # fmt: skip

    def inspector(self, url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """The Inspector's --cli."""
        launcher = self.modules / "@modelcontextprotocol/inspector/clients/launcher/build/index.js"
        return self.run(str(launcher), "--cli", url, *args, **env)


@pytest.fixture(scope="module")
def node_clients() -> NodeClients:
    """The installed clients, or a skip that says how to install them."""
    base = Path(os.environ.get("WEBCTX_TEST_MCP_CLIENTS", ROOT / ".cache" / "mcp-clients"))
    modules = base / "node_modules"
    node = modules / "node" / "bin" / "node"
    wanted = [node, modules / "@modelcontextprotocol/sdk/package.json",
              modules / "@modelcontextprotocol/inspector/package.json"]  # fmt: skip
    if not all(p.exists() for p in wanted):
        pytest.skip(f"no Node 22 and MCP clients in {base}: run scripts/mcp-clients")
    return NodeClients(node=str(node), modules=modules)
