"""Jobs against killed workers and a lost Redis: real `webctx worker` processes, real
redis-server processes, the loopback web. Each test bounds the time to its outcome.

Every test starts its own redis-server on a free port (AOF on unless it tests a Redis that
comes back empty) and never touches the test Redis: these tests stop and restart their
Redis, which must not take other tests' state with it.

What each test asserts about the store: the job fetched the mini web's five pages, every
chunk it quotes sits verbatim at its offsets, and the vector store holds exactly one point
per chunk of those pages (redelivered tasks wrote no duplicate). Bundles are not compared
across runs: equal pages and points already pin the answer down, and a rank tie could
legitimately order two runs differently.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from tests.conftest import ROOT, WorkerProcess, clean_env, run_cli
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.demo.web import load_corpus
from webctx.devweb.embeddings import embeddings_control, make_embeddings_app
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.jobs.store import JobStore
from webctx.models import Bundle
from webctx.settings import ChunkSettings
from webctx.stages.chunk import chunk_page

MODEL = "hash-embedding"
QUESTION = "battery degradation durability"
TOPIC = "Battery degradation durability notes."
VISIBILITY_S = 8
SLOW_S = 3.0
StartWorker = Callable[..., WorkerProcess]


@dataclass
class MiniWeb:
    """Five corpus pages (one of them slow), search over them, embeddings with a latency."""

    site: LoopbackServer
    search: LoopbackServer
    embeddings: LoopbackServer
    hits: collections.Counter[str]
    paths: list[str]

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(
            WEBCTX_SEARCH_PROVIDER="searxng",
            WEBCTX_SEARXNG_URL=self.search.url,
            OPENAI_BASE_URL=self.embeddings.url + "/v1",
            OPENAI_API_KEY="test-key",
            WEBCTX_EMBEDDING_MODEL=MODEL,
            WEBCTX_ALLOWED_NETWORKS="127.0.0.1/32",
            WEBCTX_FETCH__TOTAL_TIMEOUT_S="6",
            WEBCTX_FETCH__READ_TIMEOUT_S="5",
            WEBCTX_FETCH__PER_HOST_DELAY_S="0",
            WEBCTX_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S),
            WEBCTX_TASK_TIME_LIMIT_S=str(VISIBILITY_S - 1),
            WEBCTX_JOB_TIMEOUT_S="120",
            **extra,
        )

    def embedding_requests(self) -> int:
        return embeddings_control(self.embeddings.app).stats.requests  # type: ignore[arg-type]


def start_mini_web(*, embed_latency_s: float = 0.0) -> MiniWeb:
    corpus = [p for p in load_corpus() if "batter" in p.html.lower()][:5]
    pages = {p.path: SitePage(p.html) for p in corpus[:4]}
    pages["/slow.html"] = SitePage(corpus[4].html, delay_s=SLOW_S)  # distinct text: 5 pages
    hits: collections.Counter[str] = collections.Counter()
    site = LoopbackServer(make_site_app(pages, hits=hits)).start()
    docs = [SearchDoc(site.url + path, path, TOPIC) for path in pages]
    search = LoopbackServer(make_searxng_app(docs)).start()
    app = make_embeddings_app(HashEmbedder(model=MODEL).vectors, model=MODEL, rpm=None, tpm=None,
                              latency_s=embed_latency_s)  # fmt: skip
    embeddings = LoopbackServer(app).start()
    return MiniWeb(site, search, embeddings, hits, sorted(pages))


@pytest.fixture
def mini_web(request: pytest.FixtureRequest) -> Iterator[MiniWeb]:
    web = start_mini_web(embed_latency_s=getattr(request, "param", 0.0))
    yield web
    for server in (web.site, web.search, web.embeddings):
        server.stop()


class BackgroundCli:
    """`webctx research` waiting in a subprocess; output to files, never a full pipe."""

    def __init__(self, env: dict[str, str], tmp: Path, name: str, *args: str) -> None:
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        cmd = [sys.executable, "-m", "webctx.cli", "research", QUESTION, *args]
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=err)

    def wait(self, timeout_s: float) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return code, self.out.read_text(), self.err.read_text()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic()


def sigkill(worker: WorkerProcess) -> None:
    os.killpg(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(timeout=10)


def point_count(path: Path) -> int:
    store = EdgeVectorStore(path)
    try:
        return store.count()
    finally:
        store.close()


def job_store(url: str) -> JobStore:
    return JobStore(redis.Redis.from_url(url, decode_responses=True))


def assert_pages_and_points(web: MiniWeb, jobs: JobStore, bundle: Bundle, qdrant: Path) -> int:
    """The job fetched every page of the mini web, quotes each chunk verbatim at its offsets,
    and the store holds exactly one point per chunk of those pages: no duplicate from a
    redelivered task. Workers must be stopped first (the engine admits one process)."""
    pages = jobs.pages(bundle.job_id)
    assert sorted(urlsplit(p.url).path for p in pages.values()) == sorted(web.paths)
    by_source = {s.id: pages[s.content_sha256] for s in bundle.sources}
    assert bundle.chunks
    for chunk in bundle.chunks:
        assert by_source[chunk.source].text[chunk.start : chunk.end] == chunk.text
    chunking = ChunkSettings()
    expected = sum(
        len(chunk_page(p, max_tokens=chunking.max_tokens, overlap_tokens=chunking.overlap_tokens))
        for p in pages.values()
    )
    assert point_count(qdrant) == expected
    return expected


def assert_reconnected(worker: WorkerProcess) -> None:
    """The worker outlived the outage: still running, connected a second time, never crashed."""
    log = worker.log.read_text()
    assert worker.proc.poll() is None, log[-3000:]
    assert log.count("Connected to ") >= 2 and "Unrecoverable error" not in log, log[-3000:]


def clean_run(web: MiniWeb, tmp: Path) -> tuple[Bundle, int]:
    """The same job with no broker (the local service), nothing killed: the reference."""
    env = web.env(WEBCTX_QDRANT_PATH=str(tmp / "clean"))
    done = run_cli(env, "research", QUESTION,
                   "--max-sources", "5", "--top-k", "20", "--token-budget", "4000")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run_cli(env, "service", "stop")  # it holds the reference store
    return Bundle.model_validate_json(done.stdout), point_count(tmp / "clean")


# -- Redis servers of this module -------------------------------------------------------------
class OwnRedis:
    """A redis-server of this test on a free port; stop() and start() it at will."""

    def __init__(self, workdir: Path, *, persistent: bool) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.workdir, self.persistent = workdir, persistent
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        persistence = (["--appendonly", "yes", "--appendfsync", "everysec"] if self.persistent
                       else ["--appendonly", "no"])  # fmt: skip
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--dir", str(self.workdir), "--maxmemory-policy", "noeviction",
               *persistence]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        wait_until(lambda: _pings(client), 10, "redis-server to start")
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: an AOF server fsyncs before it exits
            self.proc.wait(timeout=10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def own_redis(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[OwnRedis]:
    """This test's redis-server: AOF on unless the test passes False."""
    server = OwnRedis(tmp_path / "redis", persistent=getattr(request, "param", True))
    server.start()
    yield server
    server.stop()


# -- SIGKILLed workers ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "mini_web"), [("fetch", 0.0), ("embed", 3.0)], indirect=["mini_web"]
)
def test_sigkilled_worker_task_is_redelivered_and_job_completes_without_duplicates(
    stage: str,
    mini_web: MiniWeb,
    own_redis: OwnRedis,
    tmp_path: Path,
    start_worker: StartWorker,
) -> None:
    reference, reference_points = clean_run(mini_web, tmp_path)
    slow_hits, embed_requests = mini_web.hits["/slow.html"], mini_web.embedding_requests()
    qdrant = tmp_path / "qdrant"
    env = mini_web.env(CELERY_BROKER_URL=own_redis.url, WEBCTX_QDRANT_PATH=str(qdrant))
    queues = {"fetch": "search,fetch", "embed": "embed"}
    other = {"fetch": "embed,store,rank", "embed": "search,fetch,store,rank"}
    victim = start_worker(env, "-Q", queues[stage], "-n", f"victim@{stage}")
    steady = start_worker(env, "-Q", other[stage], "-n", f"steady@{stage}")
    cli = BackgroundCli(env, tmp_path, "cli", "--max-sources", "5", "--top-k", "20",
                        "--token-budget", "4000", "--timeout", "90")  # fmt: skip
    # Counted from the clean run's totals: the kill must land inside this job's call.
    if stage == "fetch":
        wait_until(lambda: mini_web.hits["/slow.html"] > slow_hits, 30, "the slow fetch")
    else:
        # The question's request comes first (at plan time); the next is a page's.
        wait_until(lambda: mini_web.embedding_requests() > embed_requests + 1, 30,
                   "a page's embed call")  # fmt: skip
    time.sleep(0.5)  # inside the fetch (3 s page) / the embed call (3 s latency)
    killed = time.monotonic()
    sigkill(victim)
    successor = start_worker(env, "-Q", queues[stage], "-n", f"successor@{stage}")
    code, out, err = cli.wait(90)
    recovered_s = time.monotonic() - killed
    assert code == 0, err[-3000:]
    bundle = Bundle.model_validate_json(out)
    assert bundle.failures == [] and bundle.stats.fetched == reference.stats.fetched == 5
    # The whole worker died: its unacked tasks come back after the visibility timeout (the
    # upper bound leaves room for the rest of the job on a busy machine: 33 s seen there).
    assert VISIBILITY_S - 1 < recovered_s < VISIBILITY_S + 40, f"took {recovered_s:.1f}s"
    if stage == "fetch":
        assert mini_web.hits["/slow.html"] == slow_hits + 2  # the killed fetch ran again, once
    else:
        assert "Task webctx.embed[" in successor.log.read_text()  # the successor redid it
        assert mini_web.embedding_requests() > embed_requests + reference.stats.embed_requests
    for worker in (steady, successor):
        worker.stop()  # releases the engine's lock
    points = assert_pages_and_points(mini_web, job_store(own_redis.url), bundle, qdrant)
    assert points == reference_points  # redelivery wrote no duplicate
    print(f"\n[sigkill mid-{stage}] job succeeded {recovered_s:.1f}s after the kill; "
          f"{points} points, as the clean run")  # fmt: skip


# -- Redis restarts ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("own_redis", [True], indirect=True)
def test_redis_restart_with_aof_mid_job_workers_reconnect_and_job_completes(
    own_redis: OwnRedis,
    mini_web: MiniWeb,
    tmp_path: Path,
    start_worker: StartWorker,
) -> None:
    qdrant = tmp_path / "q"
    env = mini_web.env(CELERY_BROKER_URL=own_redis.url, WEBCTX_QDRANT_PATH=str(qdrant))
    worker = start_worker(env)
    cli = BackgroundCli(env, tmp_path, "cli", "--max-sources", "5", "--timeout", "90")
    wait_until(lambda: mini_web.hits["/slow.html"] >= 1, 30, "the slow fetch to start")
    own_redis.stop()  # mid-fetch: the slow page's task is unacked, the job half done
    time.sleep(2)
    own_redis.start()  # same port and dir: the AOF brings queues, unacked tasks, job state
    restarted = time.monotonic()
    code, out, err = cli.wait(90)
    done_s = time.monotonic() - restarted
    assert code == 0, err[-3000:]
    bundle = Bundle.model_validate_json(out)
    assert bundle.failures == [] and bundle.stats.fetched == 5
    assert done_s < VISIBILITY_S + 30, f"the job ended {done_s:.1f}s after the restart"
    assert_reconnected(worker)
    worker.stop()
    points = assert_pages_and_points(mini_web, job_store(own_redis.url), bundle, qdrant)
    print(f"\n[redis aof restart] job succeeded {done_s:.1f}s after the restart; {points} points")


@pytest.mark.slow
@pytest.mark.parametrize("own_redis", [False], indirect=True)
def test_redis_back_empty_fails_waiting_cli_clearly_and_resubmission_completes(
    own_redis: OwnRedis,
    mini_web: MiniWeb,
    tmp_path: Path,
    start_worker: StartWorker,
) -> None:
    qdrant = tmp_path / "q"
    env = mini_web.env(CELERY_BROKER_URL=own_redis.url, WEBCTX_QDRANT_PATH=str(qdrant))
    worker = start_worker(env)
    cli = BackgroundCli(env, tmp_path, "cli", "--max-sources", "5", "--timeout", "90")
    wait_until(lambda: mini_web.hits["/slow.html"] >= 1, 30, "the slow fetch to start")
    own_redis.stop()
    time.sleep(1)
    own_redis.start()  # no AOF, no RDB: it comes back empty
    restarted = time.monotonic()
    code, out, err = cli.wait(60)
    lost_s = time.monotonic() - restarted
    assert code == 1, err[-3000:]
    assert "job state lost (Redis restarted without persistence?); resubmit" in err
    assert "Traceback" not in err and out == ""
    assert lost_s < 10, f"the CLI noticed after {lost_s:.1f}s"
    again = time.monotonic()
    done = run_cli(env, "research", QUESTION, "--max-sources", "5", "--timeout", "90")
    resubmit_s = time.monotonic() - again
    assert done.returncode == 0, done.stderr[-3000:]  # the same worker reconnected
    bundle = Bundle.model_validate_json(done.stdout)
    assert bundle.failures == [] and bundle.stats.fetched == 5
    assert resubmit_s < 60, f"the resubmitted job took {resubmit_s:.1f}s"
    assert_reconnected(worker)
    worker.stop()
    points = assert_pages_and_points(mini_web, job_store(own_redis.url), bundle, qdrant)
    print(f"\n[redis empty] CLI failed {lost_s:.1f}s after the restart; the resubmitted job "
          f"succeeded in {resubmit_s:.1f}s; {points} points")  # fmt: skip
