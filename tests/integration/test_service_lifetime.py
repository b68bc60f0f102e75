"""The local service's Valkey lives as long as the service, however the service ends, and
`webctx service status` tells what is left running in the data directory, read from /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from tests.conftest import clean_env, run_cli, service_pid, valkey_pids
from tests.testweb import LoopbackWeb
from webctx.workers.state_server import server_binary

QUESTION = "how do lithium-ion batteries degrade?"
ENDED_WITHIN_S = 5.0
"""The goal: no Valkey outlives its service by more than a few seconds."""


def _wait_for(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _status(env: dict[str, str]) -> tuple[int, dict[str, Any], str]:
    done = run_cli(env, "service", "status")
    return done.returncode, json.loads(done.stdout), done.stderr


def _assert_nothing_left(env: dict[str, str], data_dir: Path) -> None:
    _wait_for(lambda: not valkey_pids(data_dir), ENDED_WITHIN_S, "Valkey to end")
    code, status, _ = _status(env)
    assert code == 1 and status["running"] is False
    assert status["processes"] == [] and status["strays"] == [], status


def test_a_service_stopped_right_after_it_started_leaves_no_valkey(data_dir: Path) -> None:
    env = clean_env(WEBCTX_EMBEDDING_PROVIDER="hash")
    started = run_cli(env, "service", "start")
    assert started.returncode == 0, started.stderr[-3000:]
    assert valkey_pids(data_dir)
    stopped = run_cli(env, "service", "stop")  # its worker is still loading
    assert stopped.returncode == 0 and "stopped" in stopped.stderr, stopped.stderr
    _assert_nothing_left(env, data_dir)


def test_a_service_stopped_a_second_after_a_no_wait_job_leaves_no_valkey(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    env = clean_env(**test_web.env())
    submitted = run_cli(env, "research", QUESTION, "--max-sources", "4", "--no-wait")
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    time.sleep(1.0)
    stopped = run_cli(env, "service", "stop")
    assert stopped.returncode == 0, stopped.stderr
    _assert_nothing_left(env, data_dir)


def test_the_valkey_of_a_sigkilled_service_ends_within_seconds(data_dir: Path) -> None:
    env = clean_env(WEBCTX_EMBEDDING_PROVIDER="hash")
    started = run_cli(env, "service", "start")
    assert started.returncode == 0, started.stderr[-3000:]
    pid = json.loads(started.stdout)["pid"]
    _wait_for(lambda: b" ready." in (data_dir / "service.log").read_bytes(), 60, "ready")
    (server,) = valkey_pids(data_dir)
    os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: server not in valkey_pids(data_dir), ENDED_WITHIN_S, "Valkey to end")
    _assert_nothing_left(env, data_dir)


def test_status_names_a_valkey_left_without_its_service_and_stop_ends_it(
    data_dir: Path,
) -> None:
    # As a service killed where the kernel has no parent-death signal leaves its Valkey.
    directory = data_dir / "valkey"
    directory.mkdir(parents=True)
    sock = directory / "valkey.sock"
    stray = subprocess.Popen(
        [server_binary(), "--port", "0", "--unixsocket", str(sock), "--dir", str(directory),
         "--appendonly", "yes", "--save", ""],
        cwd=directory, stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    # A shell of the user's, say, that happens to run in the folder: not the service's.
    bystander = subprocess.Popen(["sleep", "120"], cwd=data_dir)
    try:
        _wait_for(sock.exists, 10, "the stray's socket")
        env = clean_env(WEBCTX_EMBEDDING_PROVIDER="hash")
        code, status, said = _status(env)
        assert code == 1 and status["running"] is False
        assert status["strays"] == [stray.pid], status
        assert [p["kind"] for p in status["processes"]] == ["valkey"]
        assert f"valkey-server {stray.pid}" in said and "webctx service stop" in said, said
        stopped = run_cli(env, "service", "stop")
        assert f"ended valkey-server {stray.pid}" in stopped.stderr, stopped.stderr
        assert stray.wait(timeout=ENDED_WITHIN_S) is not None
        _assert_nothing_left(env, data_dir)
        assert bystander.poll() is None  # left alone
    finally:
        for proc in (stray, bystander):
            proc.kill()
            proc.wait(timeout=10)


def test_a_service_started_over_a_stray_valkey_replaces_it_and_keeps_its_data(
    data_dir: Path,
) -> None:
    directory = data_dir / "valkey"
    directory.mkdir(parents=True)
    sock = directory / "valkey.sock"
    stray = subprocess.Popen(
        [server_binary(), "--port", "0", "--unixsocket", str(sock), "--dir", str(directory),
         "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
        cwd=directory, stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(sock.exists, 10, "the stray's socket")
        redis.Redis(unix_socket_path=str(sock)).set("kept", "yes")
        env = clean_env(WEBCTX_EMBEDDING_PROVIDER="hash")
        started = run_cli(env, "service", "start")
        assert started.returncode == 0, started.stderr[-3000:]
        assert stray.wait(timeout=ENDED_WITHIN_S) == 0  # shut down: its file flushed
        code, status, _ = _status(env)
        assert code == 0 and status["strays"] == [], status
        (server,) = valkey_pids(data_dir)
        assert server != stray.pid
        assert {"pid": server, "kind": "valkey"}.items() <= next(
            p for p in status["processes"] if p["pid"] == server).items()  # fmt: skip
        assert redis.Redis(unix_socket_path=str(sock)).get("kept") == b"yes"
    finally:
        stray.kill()
        stray.wait(timeout=10)
    assert service_pid(data_dir) is not None
    run_cli(env, "service", "stop")
    _assert_nothing_left(env, data_dir)


def test_stop_ends_a_service_still_starting(data_dir: Path) -> None:
    env = clean_env(WEBCTX_EMBEDDING_PROVIDER="hash")
    starting = subprocess.Popen([sys.executable, "-m", "webctx.cli", "service", "run"], env=env,
                                cwd=data_dir.parent, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_for(lambda: service_pid(data_dir), 60, "the lock taken")
        stopped = run_cli(env, "service", "stop")
        assert f"stopped {starting.pid}" in stopped.stderr, stopped.stderr
        assert starting.wait(timeout=ENDED_WITHIN_S) is not None
    finally:
        starting.kill()
        starting.wait(timeout=10)
    _assert_nothing_left(env, data_dir)
