"""The HTTP API under load, on the local service: tenant A POSTs a burst of research jobs
at once, tenant B's single job comes in the middle of it, with and without a batch of
tenant C running; per-tenant admission (WEBCTX_ADMISSION__*) on with waiting jobs held
out of the queues (the default), on with them queued behind the front ones (HOLD=false),
and off (every job at the front), side by side in one run.

Per run: A's jobs accepted / refused (429) / failed, 5xx answers, jobs stuck, A's and B's
latency, B's latency against B's own on the idle service (the ratio), and the RSS of the
API process and the service's process tree sampled every half second. Loopback web,
hash embeddings; keep `--jobs` small on a shared machine.

    python bench/load.py [--jobs 60] [--batch 12] [--write]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import write_section  # noqa: E402
from bench.service_stop import start_web  # noqa: E402
from webctx.settings import Settings  # noqa: E402

TOPICS = ["battery degradation", "lithium plating in the cold", "calendar ageing",
          "cathode cracking", "electrolyte gassing", "LFP versus NMC", "fast charging heat",
          "sourdough starters", "solid electrolyte interphase", "second-life packs"]  # fmt: skip
KNOBS = {"max_sources": 4, "top_k": 6, "token_budget": 800}
B_QUESTION = "how do lithium-ion batteries degrade?"
B_JOBS = 5  # B's jobs in one burst at most, one after another
PAGE_S = 0.3  # each loopback page answers after this long
FINISHED = ("succeeded", "failed", "cancelled")
THREADS = Settings.model_fields["worker_concurrency"].default


@dataclass
class Job:
    """One POSTed job and how it went."""

    tenant: str
    posted: float
    status: int = 0
    answered: float = 0.0  # when the POST was answered
    job_id: str = ""
    ended: float | None = None
    outcome: str = ""  # succeeded / failed / cancelled, "" while unfinished
    reason: bool = False  # a failed job said why (error or bundle)

    @property
    def latency(self) -> float | None:
        return None if self.ended is None else self.ended - self.posted


@dataclass
class Run:
    """A burst (with or without a batch) under one admission setting."""

    caps: str
    batch: bool
    tag: str
    a: list[Job] = field(default_factory=list)
    b: list[Job] = field(default_factory=list)
    five_xx: int = 0
    rss_mb: list[tuple[float, float]] = field(default_factory=list)
    elapsed_s: float = 0.0


class Stack:
    """`webctx api` on the data directory's local service, keys for tenants a, b and c."""

    def __init__(self, web_env: dict[str, str], admission: dict[str, str], data: Path) -> None:
        ours = ("WEBCTX_", "CELERY_", "OPENAI_")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
        self.env.update({**web_env, **admission}, PYTHONPATH=str(ROOT), WEBCTX_DATA_DIR=str(data),
                        WEBCTX_FETCH__TOTAL_TIMEOUT_S="30")  # fmt: skip
        self.data = data
        cli = [sys.executable, "-m", "webctx.cli"]
        self.keys = {}
        for tenant in ("a", "b", "c"):
            out = subprocess.run([*cli, "keys", "create", "--tenant", tenant, "--rate-limit",
                                  "1000000"], env=self.env, cwd=ROOT, capture_output=True,
                                 text=True, check=True)  # fmt: skip
            self.keys[tenant] = out.stdout.strip()
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = (data / "api.log").open("wb")
        self.api = subprocess.Popen([*cli, "api", "--port", str(port)], env=self.env, cwd=ROOT,
                                    stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 120
        while not self._ready():
            if time.monotonic() > deadline or self.api.poll() is not None:
                raise SystemExit(f"api did not start: {(data / 'api.log').read_text()[-2000:]}")
            time.sleep(0.3)

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def client(self, tenant: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def rss_mb(self) -> float:
        """RSS of the API process and of the local service with all its children."""
        roots = [self.api.pid]
        try:
            roots.append(int(json.loads((self.data / "service.json").read_text())["pid"]))
        except (OSError, ValueError, KeyError):
            pass
        total = 0
        for pid in roots:
            try:
                proc = psutil.Process(pid)
                for p in [proc, *proc.children(recursive=True)]:
                    total += p.memory_info().rss
            except psutil.Error:
                continue
        return total / 2**20

    def stop(self) -> None:
        self.api.terminate()
        self.api.wait(timeout=60)
        subprocess.run([sys.executable, "-m", "webctx.cli", "service", "stop"], env=self.env,
                       cwd=ROOT, capture_output=True)  # fmt: skip
        self.log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post(client: httpx.Client, tenant: str, question: str) -> Job:
    """POST one job; its record (status code, id)."""
    job = Job(tenant=tenant, posted=time.monotonic())
    resp = client.post("/v1/jobs", json={"question": question, **KNOBS})
    job.status, job.answered = resp.status_code, time.monotonic()
    if resp.status_code == 202:
        job.job_id = resp.json()["job_id"]
    return job


def watch(stack: Stack, jobs: list[Job], *, every_s: float, timeout_s: float) -> int:
    """Poll the accepted jobs until each has finished (or `timeout_s`); the 5xx answers."""
    five_xx = 0
    deadline = time.monotonic() + timeout_s
    clients = {t: stack.client(t) for t in {j.tenant for j in jobs}}
    while time.monotonic() < deadline:
        left = [j for j in jobs if j.job_id and not j.outcome]
        if not left:
            break
        for job in left:
            resp = clients[job.tenant].get(f"/v1/jobs/{job.job_id}")
            five_xx += resp.status_code >= 500
            body = resp.json() if resp.status_code == 200 else {}
            if body.get("status") in FINISHED:
                job.ended, job.outcome = time.monotonic(), body["status"]
                if job.outcome != "succeeded":
                    job.reason = bool(body.get("error") or body.get("reason"))
        time.sleep(every_s)
    for client in clients.values():
        client.close()
    return five_xx


def idle_b(stack: Stack, n: int = 3) -> float:
    """B's job alone on the idle service, `n` times: the median latency (s)."""
    out = []
    with stack.client("b") as client:
        for i in range(n):
            job = post(client, "b", f"{B_QUESTION} ({i})")
            watch(stack, [job], every_s=0.05, timeout_s=300)
            assert job.latency is not None and job.outcome == "succeeded", job
            out.append(job.latency)
    return statistics.median(out)


def submit_batch(stack: Stack, items: int) -> str:
    """Tenant C's batch of `items` questions; its id."""
    body = [{"id": f"c-{i}", "question": f"{TOPICS[i % len(TOPICS)]} for fleets ({i})"}
            for i in range(items)]  # fmt: skip
    with stack.client("c") as client:
        resp = client.post("/v1/batches", params={"name": f"load-{time.time()}"}, json=body)
        resp.raise_for_status()
        return str(resp.json()["id"])


def burst(stack: Stack, n: int, run: Run) -> None:
    """A's `n` POSTs at once; once half of them were answered, B's jobs one after another
    (each waited for) while A's are unfinished, at most B_JOBS; wait for all."""
    sampling, a_done = threading.Event(), threading.Event()

    def sample() -> None:
        start = time.monotonic()
        while not sampling.is_set():
            run.rss_mb.append((time.monotonic() - start, stack.rss_mb()))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    answered = threading.Semaphore(0)
    a_client = stack.client("a")

    def post_a(i: int) -> Job:
        job = post(a_client, "a", f"{TOPICS[i % len(TOPICS)]} ({run.tag} {i})")
        answered.release()
        return job

    def b_jobs() -> int:
        five_xx = 0
        with stack.client("b") as b_client:
            while len(run.b) < B_JOBS and not a_done.is_set():
                job = post(b_client, "b", f"{B_QUESTION} ({run.tag} {len(run.b)})")
                run.b.append(job)
                five_xx += (job.status >= 500) + watch(stack, [job], every_s=0.05, timeout_s=900)
        return five_xx

    with ThreadPoolExecutor(min(n, 32) + 1) as pool:
        futures = [pool.submit(post_a, i) for i in range(n)]
        for _ in range(n // 2):
            answered.acquire()
        b_side = pool.submit(b_jobs)
        run.a = [f.result() for f in futures]
        run.five_xx += sum(j.status >= 500 for j in run.a)
        run.five_xx += watch(stack, run.a, every_s=0.5, timeout_s=900)
        a_done.set()
        run.five_xx += b_side.result()
    a_client.close()
    run.elapsed_s = time.monotonic() - started
    sampling.set()
    sampler.join()


def wait_batch(stack: Stack, batch_id: str) -> None:
    """Wait for C's batch to end (its items are not measured here)."""
    with stack.client("c") as client:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if client.get(f"/v1/batches/{batch_id}").json()["state"] != "running":
                return
            time.sleep(1)


def one_setting(web_env: dict[str, str], caps: str, admission: dict[str, str],
                args: argparse.Namespace) -> tuple[float, list[Run]]:  # fmt: skip
    """B idle, then the burst, then the burst with a batch, on a fresh service."""
    data = Path(tempfile.mkdtemp(prefix="webctx-bench-load-"))
    stack = Stack(web_env, admission, data)
    try:
        idle = idle_b(stack)
        runs = []
        for with_batch in (False, True):
            run = Run(caps=caps, batch=with_batch, tag="with a batch" if with_batch else "alone")
            batch_id = submit_batch(stack, args.batch) if with_batch else ""
            if with_batch:
                time.sleep(3)  # its first items are in flight
            burst(stack, args.jobs, run)
            if batch_id:
                wait_batch(stack, batch_id)
            runs.append(run)
            print(json.dumps(summary(run, idle)), file=sys.stderr)  # noqa: T201
        return idle, runs
    finally:
        stack.stop()


def summary(run: Run, idle: float) -> dict[str, object]:
    """The figures of one run."""
    accepted = [j for j in run.a if j.status == 202]
    lat = sorted(j.latency for j in accepted if j.latency is not None)
    b_lat = [j.latency for j in run.b if j.latency is not None]
    b = statistics.median(b_lat) if b_lat else float("nan")
    failed = [j for j in accepted if j.outcome and j.outcome != "succeeded"]
    codes = collections.Counter(j.status for j in run.a)
    return {
        "admission": run.caps,
        "batch": run.batch,
        "a_posted": len(run.a),
        "a_accepted": len(accepted),
        "a_refused_429": codes.get(429, 0),
        "a_failed": len(failed),
        "failed_without_reason": sum(not j.reason for j in failed),
        "stuck": sum(1 for j in [*accepted, *run.b] if j.job_id and not j.outcome),
        "five_xx": run.five_xx,
        "a_p50_s": round(statistics.median(lat), 1) if lat else None,
        "a_max_s": round(lat[-1], 1) if lat else None,
        "b_idle_s": round(idle, 2),
        "b_jobs": len(b_lat),
        "b_first_s": round(b_lat[0], 2) if b_lat else None,
        "b_post_max_s": round(max(j.answered - j.posted for j in run.b), 2) if run.b else None,
        "a_post_max_s": round(max(j.answered - j.posted for j in run.a), 2) if run.a else None,
        "b_s": round(b, 2),
        "b_max_s": round(max(b_lat), 2) if b_lat else None,
        "b_ratio": round(b_lat[0] / idle, 1) if b_lat else None,
        "b_median_ratio": round(b / idle, 1),
        "all_done_s": round(run.elapsed_s, 1),
        "rss_peak_mb": round(max(m for _, m in run.rss_mb)) if run.rss_mb else None,
        "rss_end_mb": round(run.rss_mb[-1][1]) if run.rss_mb else None,
    }


def table(rows: list[dict[str, object]]) -> str:
    """The rows as a Markdown table, one column per run."""
    names = {"a_posted": "A's jobs POSTed at once", "a_accepted": "accepted (202)",
             "a_refused_429": "refused (429, Retry-After)", "a_failed": "failed",
             "failed_without_reason": "failed without a reason", "stuck": "stuck (unfinished)",
             "five_xx": "5xx answers", "a_p50_s": "A's latency p50, s",
             "a_max_s": "A's latency max, s", "b_idle_s": "B's job on the idle service, s",
             "a_post_max_s": "A's slowest POST answer, s",
             "b_jobs": "B's jobs during the burst (one after another)",
             "b_first_s": "B's first job in the burst, s",
             "b_post_max_s": "B's slowest POST answer, s",
             "b_s": "B's jobs in the burst, median s", "b_max_s": "B's jobs in the burst, max s",
             "b_ratio": "**B's first job in the burst / B idle**",
             "b_median_ratio": "B's jobs in the burst, median / B idle",
             "all_done_s": "burst start to every job done, s",
             "rss_peak_mb": "RSS peak (API + service tree), MB",
             "rss_end_mb": "RSS at the end, MB"}  # fmt: skip
    heads = [f"{r['admission']}{', batch running' if r['batch'] else ''}" for r in rows]
    out = ["| | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(rows)]
    out += [f"| {label} | " + " | ".join(str(r[k]) for r in rows) + " |"
            for k, label in names.items()]  # fmt: skip
    return "\n".join(out)


def rss_timeline(runs: list[Run]) -> str:
    """RSS every 10 s of each run (MB)."""
    lines = []
    for run in runs:
        marks = [f"{m:.0f}" for t, m in run.rss_mb if int(t * 2) % 20 == 0]
        label = f"{run.caps}{', batch running' if run.batch else ''}"
        lines.append(f"- {label}: " + ", ".join(marks))
    return "\n".join(lines)


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), "unknown CPU")  # fmt: skip
    flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("flags")), "").split()  # fmt: skip
    have = [f for f in ("avx2", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return f"{os.cpu_count()} cores ({cpu}; {', '.join(have) or 'no avx2'}), shared"


_OFF = {"WEBCTX_ADMISSION__RUNNING": "100000", "WEBCTX_ADMISSION__QUEUED": "0"}
SETTINGS = [
    ("on", "admission on (defaults: RUNNING=2, QUEUED=30, held)", {}),
    (
        "tiers",
        "admission on, not held (HOLD=false: queued at priority 3)",
        {"WEBCTX_ADMISSION__HOLD": "false"},
    ),
    ("running1", "admission on, RUNNING=1", {"WEBCTX_ADMISSION__RUNNING": "1"}),
    ("running4", "admission on, RUNNING=4", {"WEBCTX_ADMISSION__RUNNING": "4"}),
    ("queued10", "admission on, QUEUED=10", {"WEBCTX_ADMISSION__QUEUED": "10"}),
    ("off", "admission off (every job at the front)", _OFF),
]
"""The admission settings a run may compare: key, label, environment."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=60, help="A's burst")
    parser.add_argument("--batch", type=int, default=12, help="C's batch items")
    parser.add_argument("--settings", default="on,tiers,off", help="of: " + ", ".join(
        key for key, _, _ in SETTINGS))  # fmt: skip
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    servers, web_env, _ = start_web(PAGE_S)
    # No page or search cache: every job downloads its pages, as distinct questions would.
    web_env = {**web_env, "WEBCTX_FETCH__TOTAL_TIMEOUT_S": "30", "WEBCTX_PAGE_CACHE_TTL_S": "0",
               "WEBCTX_SEARCH_CACHE_TTL_S": "0"}  # fmt: skip
    settings = [(label, env) for key, label, env in SETTINGS if key in args.settings.split(",")]
    rows, runs = [], []
    load = os.getloadavg()
    try:
        for caps, env in settings:
            idle, these = one_setting(web_env, caps, env, args)
            rows += [summary(r, idle) for r in these]
            runs += these
    finally:
        for server in servers:
            server.stop()
    body = (
        f"{machine()}; load average {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} at start. "
        f"The local service (its default {THREADS} worker threads), `webctx api` with keys; "
        f"loopback pages answering after {PAGE_S} s "
        "(no page or search cache), hash embeddings. Tenant A POSTs "
        f"{args.jobs} jobs at once ({KNOBS['max_sources']} sources each), tenant B, once half "
        f"of A's POSTs were answered, one job after another (each waited for) while A's are "
        f'unfinished, at most {B_JOBS}; "batch running": tenant C\'s batch of '
        f"{args.batch} items was submitted 3 s before. B idle: the median of 3 jobs alone on "
        "the same service, just before. A's refused jobs are not retried.\n\n"
        + table(rows)
        + "\n\nRSS every 10 s of each burst (MB):\n\n"
        + rss_timeline(runs)
        + "\n"
    )
    print(body)  # noqa: T201
    if args.write:
        write_section("load", body)


if __name__ == "__main__":
    main()
