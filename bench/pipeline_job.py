"""Wall time and stage times of one research job over 20 sources on the loopback demo web,
on the embedded default and in broker mode (2 worker processes on the machine's Redis),
side by side in one run.

    python bench/pipeline_job.py [--runs 3] [--page-delay 0.2] [--write]

Pages are served with `--page-delay` seconds of latency each so fetch concurrency shows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import write_section  # noqa: E402
from webctx.demo.web import DemoWeb  # noqa: E402
from webctx.devweb.site import SitePage  # noqa: E402
from webctx.models import Bundle  # noqa: E402

QUESTION = "how do lithium-ion batteries degrade?"
REDIS_URL = os.environ.get("WEBCTX_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")


def _env(web: DemoWeb, qdrant: str, broker: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBCTX_", "CELERY_"))}
    env.update(web.env(), WEBCTX_QDRANT_PATH=qdrant, PYTHONPATH=str(ROOT))
    env["WEBCTX_DATA_DIR"] = qdrant + "-data"  # the embedded state server's files, not the user's
    if broker:
        env["CELERY_BROKER_URL"] = REDIS_URL
    return env


def _job(env: dict[str, str]) -> tuple[float, Bundle]:
    cmd = [
        sys.executable,
        "-m",
        "webctx.cli",
        "research",
        QUESTION,
        "--max-sources",
        "20",
        "--top-k",
        "12",
        "--token-budget",
        "3000",
    ]
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"job failed: {done.stderr[-2000:]}")
    return wall, Bundle.model_validate_json(done.stdout)


def _workers(env: dict[str, str], logdir: str) -> list[subprocess.Popen[bytes]]:
    procs = []
    for name, queues in (("io", "search,fetch,embed"), ("vec", "store,rank")):
        log = open(os.path.join(logdir, f"{name}.log"), "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "webctx.cli",
                    "worker",
                    "-Q",
                    queues,
                    "-n",
                    f"{name}@%h",
                    "--loglevel",
                    "INFO",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = [Path(logdir, f"{n}.log").read_bytes() for n in ("io", "vec")]
        if all(b"ready." in log for log in logs):
            return procs
        time.sleep(0.2)
    raise SystemExit("workers did not start")


def _row(mode: str, runs: list[tuple[float, Bundle]]) -> str:
    cold_wall, cold = runs[0]
    walls = [w for w, _ in runs[1:]]
    job = [b.stats.elapsed_s for _, b in runs[1:]]
    stages = runs[-1][1].stats.stage_s
    b = runs[-1][1]
    cols = " | ".join(
        f"{stages.get(s, 0):.2f}" for s in ("plan", "search", "fetch", "embed", "store", "rank")
    )
    return (
        f"| {mode} | {cold_wall:.2f} | {cold.stats.elapsed_s:.2f} | {cold.stats.embed_requests} "
        f"| {statistics.median(walls):.2f} | {statistics.median(job):.2f} | {cols} | "
        f"{b.stats.fetched} | {b.stats.failed} | {b.stats.chunks} | {b.stats.embed_requests} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--page-delay", type=float, default=0.2)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    web = DemoWeb()
    web.start()
    assert web.site is not None
    # Re-serve every page with latency: swap the site for a delayed one.
    web.site.stop()
    from webctx.devweb.server import LoopbackServer
    from webctx.devweb.site import make_site_app

    port = web.site.port
    pages = {p.path: SitePage(body=p.html, delay_s=args.page_delay) for p in web.pages}
    web.site = LoopbackServer(make_site_app(pages), port=port).start()
    results: dict[str, list[tuple[float, Bundle]]] = {"embedded": [], "broker (2 workers)": []}
    with tempfile.TemporaryDirectory() as tmp:
        local = _env(web, f"{tmp}/emb", broker=False)
        try:
            for _ in range(args.runs):  # one data directory: its local service keeps the caches
                results["embedded"].append(_job(local))
        finally:  # the runs went through the data directory's local service: stop it
            stop = [sys.executable, "-m", "webctx.cli", "service", "stop"]
            subprocess.run(stop, env=local, capture_output=True, check=False)
        redis.Redis.from_url(REDIS_URL).flushdb()
        env = _env(web, f"{tmp}/brk", broker=True)
        procs = _workers(env, tmp)
        try:
            for _ in range(args.runs):
                results["broker (2 workers)"].append(_job(env))
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)
    web.stop()
    header = (
        "| mode | cold: command wall s | cold: job elapsed s | cold: embed requests | "
        "warm: command wall s (median) | warm: job elapsed s (median) | plan | search | fetch | "
        "embed | store | rank | fetched | failed | chunks | embed requests |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = "\n".join(_row(mode, runs) for mode, runs in results.items())
    ratio = statistics.median(w for w, _ in results["broker (2 workers)"][1:]) / statistics.median(
        w for w, _ in results["embedded"][1:]
    )
    emb = results["embedded"]
    warm_cold = statistics.median(w for w, _ in emb[1:]) / emb[0][0]
    text = (
        f"One job with --max-sources 20 over the 20-page demo web (its search finds "
        f"{results['embedded'][-1][1].stats.results} of them), each page served with "
        f"{args.page_delay} s latency; {args.runs} runs per mode, the first cold, the others "
        "warm; stage seconds from the last run (stages overlap). Command wall time includes "
        "interpreter start-up and imports. Both modes keep the page, search and embedding "
        "caches across runs (broker mode in its Redis, the embedded default in its data "
        "directory's Valkey server), so warm runs download and embed nothing.\n\n"
        f"{header}\n{rows}\n\n"
        f"embedded warm/cold command wall-time ratio: {warm_cold:.2f}; "
        f"broker/embedded warm command wall-time ratio: {ratio:.2f}\n"
    )
    print(text)
    if args.write:
        write_section("pipeline_job", text)


if __name__ == "__main__":
    main()
