"""The processes a data directory's local service leaves behind, read from /proc (a pid file
is no proof either way: a dead server's pid may belong to another process by now).

A process belongs to the data directory when it is a `valkey-server` (or `redis-server`)
serving the directory's socket or running in its folder, or a `webctx service run` or
one of its Python children (extraction processes, multiprocessing's resource tracker)
whose working folder is the data directory; a shell or a client that happens to run in
that folder is none of them. Without /proc (macOS) only a server that answers on
the socket is found (webctx/workers/state_server.py asks it for its pid).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

SERVER_NAMES = (b"valkey-server", b"redis-server")
CHILD_MARK = b"multiprocessing"
"""In the command line of the service's Python children (`spawn_main`, the resource
tracker)."""


@dataclass(frozen=True)
class Stray:
    """A process of the data directory: what it is, its parent, and how long it has run."""

    pid: int
    kind: str
    """`valkey` (the state server), `service` (`webctx service run`) or `child` (anything
    else started in the data directory)."""
    ppid: int
    age_s: float


def directory_processes(data_dir: Path, *, socket: Path | None = None) -> list[Stray]:
    """Every process of `data_dir` (`socket`: its state server's, when not in the
    directory), this process excepted."""
    root = Path("/proc")
    if not root.is_dir():
        return []
    data_dir = data_dir.resolve()
    server_dir = data_dir / "valkey"
    marks = [os.fsencode(server_dir / "valkey.sock")]
    if socket is not None:
        marks.append(os.fsencode(socket))
    uptime, found = _uptime(), []
    for entry in root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cwd = Path(os.readlink(entry / "cwd"))
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if stat[0] == "Z":
            continue  # exited: waits for its parent to reap it
        server = any(name in cmdline for name in SERVER_NAMES)
        if server and (cwd == server_dir or any(mark in cmdline for mark in marks)):
            kind = "valkey"
        elif cwd == data_dir and b"service\x00run" in cmdline:
            kind = "service"
        elif cwd == data_dir and CHILD_MARK in cmdline:
            kind = "child"
        else:
            continue  # a shell or a client that happens to run in the folder: not ours
        age = uptime - int(stat[19]) / os.sysconf("SC_CLK_TCK")
        found.append(Stray(int(entry.name), kind, int(stat[1]), round(age, 2)))
    return sorted(found, key=lambda s: s.pid)


def _uptime() -> float:
    """Seconds since boot, to the hundredth (a process's start time is counted from boot)."""
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie has ended)."""
    if Path("/proc").is_dir():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end(pids: list[int], *, timeout_s: float = 10.0) -> None:
    """SIGTERM each process, SIGKILL those still running after `timeout_s`; returns once
    all have ended."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if not wait_ended(pids, timeout_s):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_ended(pids, 5.0)


def wait_ended(pids: list[int], timeout_s: float) -> bool:
    """True once none of `pids` runs, False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
