"""The local service (no broker), side by side in one run: a client command when no service
runs (cold: it starts one) against the same command with the service warm; a client's
start to its first request at the service; and the same question asked again from a new
process (pages downloaded, tokens embedded, job time), with the embeddings API and with the
local model (whose one-off jobs index their pages after the answer), on the demo web.

    python bench/service_start.py [--rounds 5] [--page-delay 0.2] [--write]
"""

from __future__ import annotations

import argparse
import collections
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
from webctx.devweb.server import LoopbackServer  # noqa: E402
from webctx.devweb.site import SitePage, make_site_app  # noqa: E402
from webctx.models import Bundle  # noqa: E402
from webctx.workers.service_client import running_service  # noqa: E402

QUESTION = "how do lithium-ion batteries degrade?"


def _cli(env: dict[str, str], *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "webctx.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"webctx {' '.join(args)} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - started, done


def _worker_ready_s(data_dir: Path, before: int, started: float) -> float:
    """Seconds from `started` until the service's log says its worker consumes."""
    log = data_dir / "service.log"
    while log.read_text(errors="replace").count(" ready.") <= before:
        time.sleep(0.01)
    return time.perf_counter() - started


def cold_and_warm(env: dict[str, str], data_dir: Path, rounds: int) -> dict[str, list[float]]:
    """`webctx sources list` with no service (it starts one) and with the service warm."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        _cli(env, "service", "stop")
        log = data_dir / "service.log"
        before = log.read_text(errors="replace").count(" ready.") if log.exists() else 0
        started = time.perf_counter()
        cold, _ = _cli(env, "sources", "list")
        out["cold"].append(cold)
        out["ready"].append(_worker_ready_s(data_dir, before, started))
        warm, _ = _cli(env, "sources", "list")
        out["warm"].append(warm)
    return out


def first_request(env: dict[str, str], data_dir: Path, rounds: int) -> list[float]:
    """Seconds from a client's spawn to its first command at the warm service's Valkey (the
    server's own clock, read through MONITOR)."""
    info = running_service(data_dir)
    assert info is not None
    delays = []
    client = redis.Redis(unix_socket_path=info.socket)
    with client.monitor() as monitor:
        for _ in range(rounds):
            spawned = time.time()
            proc = subprocess.Popen([sys.executable, "-m", "webctx.cli", "sources", "list"],
                                    env=env, cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
            name = f"webctx:{proc.pid}"
            while True:
                command = monitor.next_command()
                if name in command["command"]:
                    delays.append(float(command["time"]) - spawned)
                    break
            proc.wait(timeout=60)
    client.close()
    return delays


def rerun(env: dict[str, str], hits: collections.Counter[str]) -> list[tuple[float, int, Bundle]]:
    """The question twice, each from a new `webctx research` process: (wall, downloads,
    bundle) per run."""
    runs = []
    for _ in range(2):
        before = sum(hits.values())
        wall, done = _cli(env, "research", QUESTION, "--max-sources", "20", "--top-k", "12",
                          "--token-budget", "3000")  # fmt: skip
        runs.append((wall, sum(hits.values()) - before, Bundle.model_validate_json(done.stdout)))
    return runs


def local_env(env: dict[str, str]) -> dict[str, str] | None:
    """`env` with the local model instead of the embeddings API (a one-off job then takes
    the lexical first pass and its pages are indexed after its answer), or None without
    the webctx[local] extra."""
    from webctx.adapters.local_embedder import local_available

    if not local_available():
        return None
    local = {k: v for k, v in env.items()
             if not k.startswith("OPENAI_") and k != "WEBCTX_EMBEDDING_MODEL"}  # fmt: skip
    return dict(local, WEBCTX_EMBEDDING_PROVIDER="local")


def rerun_rows(label: str, runs: list[tuple[float, int, Bundle]]) -> str:
    """Table rows of a cold run and the warm one after it."""
    return "".join(
        f"| {name}{label} | {wall:.2f} | {b.stats.elapsed_s:.2f} | {downloads} | "
        f"{b.stats.tokens_embedded} | {b.stats.embed_requests} |\n"
        for name, (wall, downloads, b) in zip(("cold", "warm"), runs, strict=True)
    )


def ratio(runs: list[tuple[float, int, Bundle]]) -> str:
    """The warm run's job time as a share of the cold one's, and its command's wall time."""
    (cold_wall, _, cold), (warm_wall, _, warm) = runs
    return (f"{warm.stats.elapsed_s / cold.stats.elapsed_s:.1%} (command wall time "
            f"{warm_wall / cold_wall:.1%})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--page-delay", type=float, default=0.2)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    web = DemoWeb().start()
    assert web.site is not None
    web.site.stop()  # served again with latency and a request counter
    hits: collections.Counter[str] = collections.Counter()
    pages = {p.path: SitePage(body=p.html, delay_s=args.page_delay) for p in web.pages}
    web.site = LoopbackServer(make_site_app(pages, hits=hits), port=web.site.port).start()
    with tempfile.TemporaryDirectory(prefix="webctx-bench-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBCTX_", "CELERY_"))}
        env.update(web.env(), PYTHONPATH=str(ROOT))
        starts_dir, rerun_dir = Path(tmp, "starts"), Path(tmp, "rerun")
        local_dir = Path(tmp, "rerun-local")
        try:
            env["WEBCTX_DATA_DIR"] = str(starts_dir)
            calls = cold_and_warm(env, starts_dir, args.rounds)
            delays = first_request(env, starts_dir, args.rounds * 2)
            _cli(env, "service", "stop")
            env["WEBCTX_DATA_DIR"] = str(rerun_dir)
            runs = rerun(env, hits)
            local = local_env(dict(env, WEBCTX_DATA_DIR=str(local_dir)))
            local_runs = rerun(local, hits) if local is not None else []
        finally:
            for data_dir in (starts_dir, rerun_dir, local_dir):
                _cli(dict(env, WEBCTX_DATA_DIR=str(data_dir)), "service", "stop")
            web.stop()
    med = statistics.median
    local_rows = rerun_rows(" (local model)", local_runs) if local_runs else ""
    local_ratio = (f"; with the local model, the second asked at once while the first job's "
                   f"pages are indexed after its answer: {ratio(local_runs)}"
                   if local_runs else "")  # fmt: skip
    body = (
        f"`webctx sources list` from a new process, {args.rounds} rounds (medians; min-max): "
        "cold, no service running (the command starts it and returns once its Valkey "
        'answers), then warm. "Worker ready" is when the cold service\'s worker consumes '
        "(a job submitted earlier waits in the queue until then).\n\n"
        "| | cold call s | warm call s | cold - warm s | cold start to worker ready s |\n"
        "|---|---|---|---|---|\n"
        f"| sources list | {med(calls['cold']):.2f} ({min(calls['cold']):.2f}-"
        f"{max(calls['cold']):.2f}) | {med(calls['warm']):.2f} ({min(calls['warm']):.2f}-"
        f"{max(calls['warm']):.2f}) | {med(calls['cold']) - med(calls['warm']):.2f} | "
        f"{med(calls['ready']):.2f} ({min(calls['ready']):.2f}-{max(calls['ready']):.2f}) |\n\n"
        f"Client start (spawn of `webctx sources list`) to its first command at the warm "
        f"service's Valkey (the server's clock, MONITOR), {len(delays)} runs: median "
        f"{med(delays) * 1000:.0f} ms, min {min(delays) * 1000:.0f}, "
        f"max {max(delays) * 1000:.0f}.\n\n"
        f"The same question (--max-sources 20 on the demo web, pages served with "
        f"{args.page_delay} s of latency) asked twice, each time from a new "
        "`webctx research` process, through one service (the first starts it), with the "
        "embeddings API and, in a data directory of its own, with the local model:\n\n"
        "| run | command wall s | job elapsed s | pages downloaded | tokens embedded | "
        "embed requests |\n|---|---|---|---|---|---|\n"
        f"{rerun_rows('', runs)}{local_rows}\n"
        f"warm/cold job time: {ratio(runs)}{local_ratio}. Load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end ({os.cpu_count()} "
        "cores, shared).\n"
    )
    print(body)
    if args.write:
        write_section("service_start", body)


if __name__ == "__main__":
    main()
