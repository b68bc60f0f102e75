"""The embedded default's state server: one real Valkey per data directory, reused by
every process, persisted in its append-only file, stopped by the last process out."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from tests.conftest import ROOT
from webctx.workers import state_server
from webctx.workers.state_server import MAX_SOCKET_PATH, release_all, socket_path, state_server_url

# A process that uses the data directory's server, counts once, then waits for a line.
USER = """
import sys, redis
from pathlib import Path
from webctx.workers.state_server import state_server_url
url = state_server_url(Path(sys.argv[1]))
print(redis.Redis.from_url(url).incr("users"), flush=True)
sys.stdin.readline()
"""


def _user(data_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", USER, str(data_dir)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()  # connected
    return proc


def _finish(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0


def _server_pid(data_dir: Path) -> int | None:
    pidfile = data_dir / "valkey" / "valkey.pid"
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def test_two_processes_share_one_server_and_the_last_one_out_stops_it(data_dir: Path) -> None:
    first = _user(data_dir)
    pid = _server_pid(data_dir)
    second = _user(data_dir)
    assert _server_pid(data_dir) == pid is not None
    _finish(first)  # its starter leaves; the other process still uses it
    assert _server_pid(data_dir) == pid
    client = redis.Redis.from_url(state_server_url(data_dir))
    assert client.get("users") == b"2"
    _finish(second)
    assert _server_pid(data_dir) == pid  # we are still connected
    release_all()
    assert _server_pid(data_dir) is None
    assert not (data_dir / "valkey" / "valkey.sock").exists()


def test_what_was_written_survives_a_restart_from_the_append_only_file(data_dir: Path) -> None:
    redis.Redis.from_url(state_server_url(data_dir)).set("kept", "yes")
    release_all()  # the only user: the server stops, flushing its append-only file
    assert _server_pid(data_dir) is None
    assert redis.Redis.from_url(state_server_url(data_dir)).get("kept") == b"yes"


def test_a_killed_server_leaves_a_socket_and_pid_file_that_do_not_block_the_next_start(
    data_dir: Path,
) -> None:
    user = _user(data_dir)
    pid = _server_pid(data_dir)
    assert pid is not None
    os.kill(user.pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    user.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _server_pid(data_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (data_dir / "valkey" / "valkey.sock").exists()  # stale: nobody listens
    started = time.monotonic()
    client = redis.Redis.from_url(state_server_url(data_dir))
    assert time.monotonic() - started < 5
    assert client.get("users") == b"1"  # written a second before the kill: in the AOF
    assert _server_pid(data_dir) not in (None, pid)


def test_a_socket_file_nobody_listens_on_is_replaced(data_dir: Path) -> None:
    directory = data_dir / "valkey"
    directory.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(directory / "valkey.sock"))
    stale.close()  # the file stays, refusing connections
    (directory / "valkey.pid").write_text("999999\n")
    assert redis.Redis.from_url(state_server_url(data_dir)).ping()


def test_a_deep_data_dir_gets_its_socket_under_the_runtime_dir(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d" * 40] * 3) / "valkey"
    path = socket_path(deep)
    assert len(os.fsencode(path)) <= MAX_SOCKET_PATH
    assert deep not in path.parents
    assert socket_path(deep) == path  # stable: every process finds the same socket
    assert socket_path(tmp_path / "valkey") == tmp_path / "valkey" / "valkey.sock"


def test_a_deep_data_dir_still_serves(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d" * 40] * 3)
    try:
        assert redis.Redis.from_url(state_server_url(deep)).ping()
    finally:
        release_all()


def test_the_server_listens_on_no_tcp_port(data_dir: Path) -> None:
    client = redis.Redis.from_url(state_server_url(data_dir))
    assert client.config_get("port") == {"port": "0"}
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert state_server.server_binary().endswith("valkey-server")
