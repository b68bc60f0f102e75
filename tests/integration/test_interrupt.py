"""Ctrl-C on a waiting `webctx research`: the job is cancelled (on the path that hands the
command's words to the local service and on the one where the command submits by
itself), the command says so in one line and exits 130, and the job's tasks stop. Real
CLI processes sent SIGINT to their process group, as a terminal does, mid-job: the
loopback site takes seconds per page."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, as_at_a_terminal, clean_env, run_cli, state_server_pid
from tests.integration.conftest import start_paced_web
from tests.testweb import LoopbackWeb

PAGE_S = 6.0
QUESTION = "how do lithium-ion batteries degrade?"
JOB_ID = re.compile(r"job ([0-9a-f]{8}) running: searched \d+/\d+ queries, fetched \d+/[1-9]")


@pytest.fixture(scope="module")
def slow_web() -> Iterator[LoopbackWeb]:
    """The demo corpus, each page answered after PAGE_S."""
    web = start_paced_web(delay_s=PAGE_S)
    yield web
    web.stop()


def _env(web: LoopbackWeb) -> dict[str, str]:
    slow = {"WEBCTX_FETCH__TOTAL_TIMEOUT_S": "30", "WEBCTX_FETCH__READ_TIMEOUT_S": "30"}
    return clean_env(**{**web.env(), **slow})


@dataclass
class Research:
    """A `webctx research` in its own process group, its stderr in a file."""

    proc: subprocess.Popen[bytes]
    stderr: Path

    @classmethod
    def start(cls, env: dict[str, str], tmp: Path, *words: str) -> Research:
        """Start it with `words` after the question."""
        err = tmp / "research.err"
        with err.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "webctx.cli", "research", QUESTION, *words],
                env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sink,
                start_new_session=True, preexec_fn=as_at_a_terminal,
            )  # fmt: skip
        return cls(proc, err)

    def text(self) -> str:
        """What it wrote on stderr so far."""
        return self.stderr.read_text(errors="replace")

    def wait_fetching(self, timeout_s: float = 90) -> str:
        """Its job's short id, once the job downloads its pages."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = JOB_ID.search(self.text())
            if found:
                return found.group(1)
            assert self.proc.poll() is None, self.text()[-2000:]
            time.sleep(0.05)
        raise AssertionError(f"the job never fetched: {self.text()[-2000:]}")

    def interrupt(self) -> None:
        """Ctrl-C, as a terminal sends it: SIGINT to the process group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def exit_code(self, timeout_s: float = 30) -> int:
        """Its exit status, waited for at most `timeout_s`."""
        return self.proc.wait(timeout=timeout_s)


def _submitted_by_service(data_dir: Path) -> int:
    log = data_dir / "service.log"
    return log.read_text().count("job submitted") if log.exists() else 0


def _status(env: dict[str, str], ref: str) -> dict[str, object]:
    import json

    done = run_cli(env, "status", ref)
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, object] = json.loads(done.stdout)
    return found


def _interrupted_job_is_cancelled_and_stops(
    env: dict[str, str], research: Research, web: LoopbackWeb
) -> str:
    short = research.wait_fetching()
    research.interrupt()
    assert research.exit_code() == 130
    last = research.text().strip().splitlines()[-1]
    assert re.fullmatch(rf"cancelled job {short}[0-9a-f]{{24}}", last), research.text()[-2000:]
    job_id = last.split()[-1]
    assert _status(env, short)["status"] == "cancelled"  # the 8 characters shown name it
    # The pages in flight at the interruption land; nothing is done with them.
    hits = sum(web.hits.values())
    time.sleep(PAGE_S + 4)
    status = _status(env, job_id)
    assert status["status"] == "cancelled" and status["fetched"], status
    assert status["embedded"] == 0 and not status["counters"].get("chunks"), status  # type: ignore[attr-defined]
    assert sum(web.hits.values()) - hits <= 4  # fetches that had passed their check
    no_bundle = run_cli(env, "bundle", job_id)
    assert no_bundle.returncode == 1 and "(cancelled)" in no_bundle.stderr
    return job_id


def test_ctrl_c_on_research_handed_to_the_service_cancels_its_job(
    slow_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    env = _env(slow_web)
    assert run_cli(env, "service", "start").returncode == 0
    research = Research.start(env, tmp_path, "--max-sources", "6")
    _interrupted_job_is_cancelled_and_stops(env, research, slow_web)
    assert _submitted_by_service(data_dir) == 1  # the hand-over path


def test_ctrl_c_on_research_that_submitted_itself_cancels_its_job(
    slow_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    env = _env(slow_web)  # no service runs: the command starts one and submits by itself
    research = Research.start(env, tmp_path, "--max-sources", "6")
    _interrupted_job_is_cancelled_and_stops(env, research, slow_web)
    assert _submitted_by_service(data_dir) == 0


def test_a_second_ctrl_c_while_cancelling_exits_at_once(
    slow_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    env = _env(slow_web)
    assert run_cli(env, "service", "start").returncode == 0
    research = Research.start(env, tmp_path, "--max-sources", "6")
    short = research.wait_fetching()
    valkey = state_server_pid(data_dir)
    assert valkey is not None
    os.kill(valkey, signal.SIGSTOP)  # the cancel cannot reach the job state: it waits
    try:
        research.interrupt()
        time.sleep(1.0)
        assert research.proc.poll() is None, research.text()[-2000:]  # still cancelling
        research.interrupt()
        assert research.exit_code(timeout_s=5) == 130
    finally:
        os.kill(valkey, signal.SIGCONT)
    last = research.text().strip().splitlines()[-1]
    assert re.fullmatch(rf"interrupted again: job {short}[0-9a-f]{{24}} may still run "
                        r"\(`webctx cancel [0-9a-f]{32}`\)", last), last  # fmt: skip
    job_id = re.findall(r"[0-9a-f]{32}", last)[0]
    assert _status(env, job_id)["status"] in ("queued", "running")  # not cancelled
    cancelled = run_cli(env, "cancel", short)
    assert cancelled.returncode == 0, cancelled.stderr[-2000:]
    assert cancelled.stderr.strip() == f"cancelled job {job_id}"
    assert _status(env, job_id)["status"] == "cancelled"


def test_a_no_wait_job_is_not_cancelled(
    slow_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    env = _env(slow_web)
    assert run_cli(env, "service", "start").returncode == 0
    done = run_cli(env, "research", QUESTION, "--max-sources", "2", "--no-wait")
    assert done.returncode == 0, done.stderr[-2000:]
    job_id = done.stdout.strip()
    time.sleep(1.0)
    # Its pages take 6 s: still going after the command left, unless a starved machine
    # took that long to start the status command (then it has ended, and not cancelled).
    assert _status(env, job_id)["status"] in ("queued", "running", "succeeded")
    deadline = time.monotonic() + PAGE_S + 60
    while _status(env, job_id)["status"] in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert _status(env, job_id)["status"] == "succeeded"
