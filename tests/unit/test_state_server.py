"""The embedded default's state server: one real Valkey per data directory, owned by the
process that started it and ending with it (however it ends), persisted in its
append-only file; one a dead owner left running is replaced by the next owner."""

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


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def test_the_owner_stops_its_server_at_exit_though_another_process_uses_it(
    data_dir: Path,
) -> None:
    owner = _user(data_dir)
    pid = _server_pid(data_dir)
    user = _user(data_dir)  # finds the owner alive: uses its server
    assert _server_pid(data_dir) == pid is not None
    client = redis.Redis.from_url(state_server_url(data_dir))  # and so does this process
    assert client.get("users") == b"2"
    _finish(owner)
    assert _gone(pid, 10)
    _finish(user)


def test_a_server_ends_with_its_owner_killed_by_sigkill(data_dir: Path) -> None:
    owner = _user(data_dir)
    pid = _server_pid(data_dir)
    assert pid is not None
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(timeout=10)
    assert _gone(pid, 5)  # the kernel's parent-death signal, not a pid file


def test_a_server_left_running_by_a_dead_owner_is_replaced_and_keeps_what_it_held(
    data_dir: Path,
) -> None:
    directory = data_dir / "valkey"
    directory.mkdir(parents=True)
    sock = directory / "valkey.sock"
    # As a service killed where there is no parent-death signal (or an older webctx) leaves it.
    stray = subprocess.Popen(
        [state_server.server_binary(), "--port", "0", "--unixsocket", str(sock), "--dir",
         str(directory), "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
        cwd=directory, stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not sock.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    redis.Redis(unix_socket_path=str(sock)).set("kept", "yes")
    client = redis.Redis.from_url(state_server_url(data_dir))
    assert stray.wait(timeout=10) == 0  # asked to shut down: its file flushed
    assert client.get("kept") == b"yes"
    assert _server_pid(data_dir) not in (None, stray.pid)


def test_what_was_written_survives_a_restart_from_the_append_only_file(data_dir: Path) -> None:
    redis.Redis.from_url(state_server_url(data_dir)).set("kept", "yes")
    release_all()  # its owner: the server stops, flushing its append-only file
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
