"""The batch benchmark's worker processes: `webctx worker` subprocesses by role, and their
memory and CPU read from /proc (bench/batch_scaling.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Workers:
    """N search/fetch/embed worker processes and one store/rank process, `threads` each."""

    def __init__(self, env: dict[str, str], n: int, logdir: Path, *, threads: int) -> None:
        self.qdrant = env["WEBCTX_QDRANT_PATH"]
        specs = [(f"io{i}", "search,fetch,embed") for i in range(n)] + [("vec", "store,rank")]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [logdir / f"{name}.log" for name, _ in specs]
        for (name, queues), log in zip(specs, self.logs, strict=True):
            cmd = [
                sys.executable,
                "-m",
                "webctx.cli",
                "worker",
                "-Q",
                queues,
                "-n",
                f"{name}@%h",
                "-c",
                str(threads),
                "--loglevel",
                "INFO",  # "ready." is an INFO line
            ]
            with log.open("wb") as out:
                self.procs.append(
                    subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
                )
        deadline = time.monotonic() + 120
        while not all(b"ready." in log.read_bytes() for log in self.logs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                tails = [log.read_text()[-1500:] for log in self.logs]
                self.stop()
                raise SystemExit(f"workers did not start: {tails}")
            time.sleep(0.3)

    def rss_mb(self) -> dict[str, float]:
        """Resident memory by role: the largest search/fetch/embed process; the store/rank
        one's RSS, its PSS (a page mapped twice counts once), its anonymous memory (heap),
        and the part of its RSS that is the embedded engine's mapped files, with the
        write-ahead log's share of that apart (file-backed: the kernel can reclaim it)."""
        out = []
        for proc in self.procs:
            lines = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            kb = {k: int(v.split()[0]) for k, _, v in (ln.partition(":") for ln in lines)
                  if k in ("VmRSS", "RssAnon")}  # fmt: skip
            out.append((kb["VmRSS"] / 1024, kb["RssAnon"] / 1024))
        vec = self.procs[-1].pid
        rollup = Path(f"/proc/{vec}/smaps_rollup").read_text()
        pss = next(int(ln.split()[1]) for ln in rollup.splitlines() if ln.startswith("Pss:"))
        engine, wal = _mapped_kb(vec, self.qdrant)
        return {
            "io": max(rss for rss, _ in out[:-1]),
            "vec": out[-1][0],
            "vec_pss": pss / 1024,
            "vec_anon": out[-1][1],
            "vec_engine": engine / 1024,
            "vec_wal": wal / 1024,
        }

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) so far by role: all search/fetch/embed processes, and
        the store/rank one."""
        ticks = os.sysconf("SC_CLK_TCK")
        out = []
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / ticks)
        return {"io": sum(out[:-1]), "vec": out[-1]}

    def stop(self) -> None:
        """Warm shutdown of every process."""
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _mapped_kb(pid: int, under: str) -> tuple[int, int]:
    """Resident kB of process `pid`'s mappings of files under `under` (the engine's shards:
    `<path>` and `<path>.sparse`), and of those in a `wal` folder."""
    total = wal = 0
    path = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):  # a mapping
            path = head[5] if len(head) == 6 else ""
        elif head and head[0] == "Rss:" and path.startswith(under):
            total += int(head[1])
            wal += int(head[1]) if "/wal/" in path else 0
    return total, wal
