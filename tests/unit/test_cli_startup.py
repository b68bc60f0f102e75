"""The command line's start: the garbage collector is off while a command loads (its
imports make ~75k objects that live as long as it does) and on, with those objects left
out, while the command works. `webctx research` keeps it off through its submission."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs `main()` in a new interpreter with the submission and the state stores replaced by
# recorders of the collector's state (no broker is reached: nothing here needs one).
SCRIPT = """
import gc, json, sys
from contextlib import contextmanager
import webctx.api.runtime as runtime
import webctx.workers.deps as deps
from webctx.errors import WebctxError

seen = {}

@contextmanager
def open_runtime(settings):
    seen["collecting at open"] = gc.isenabled()
    yield None

def submit(runtime, caller, request, idempotency_key=None):
    seen["collecting at submit"] = gc.isenabled()
    return "job-1", True

def state_stores(settings, **_):
    seen["collecting in the command"] = gc.isenabled()
    raise WebctxError("no state store here")

runtime.open_runtime, runtime.submit, deps.state_stores = open_runtime, submit, state_stores
gc.collect()
sys.argv = ["webctx", *json.loads(sys.argv[1])]
from webctx.cli.main import main
try:
    main()
except SystemExit as exc:
    seen["exit"] = exc.code
seen["collecting after"] = gc.isenabled()
seen["frozen"] = gc.get_freeze_count()
print(json.dumps(seen))
"""


def _main(*argv: str) -> dict[str, Any]:
    env = {**os.environ, "CELERY_BROKER_URL": "redis://127.0.0.1:9/0"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_research_collects_nothing_until_its_job_is_submitted() -> None:
    seen = _main("research", "why is the sky blue?", "--no-wait")
    assert seen["exit"] in (0, None)
    assert seen["collecting at open"] is False and seen["collecting at submit"] is False
    # The wait collects again, and never walks what the command loaded.
    assert seen["collecting after"] is True and seen["frozen"] > 10_000


def test_a_research_request_refused_before_submission_still_exits_settled() -> None:
    seen = _main("research", "   ", "--no-wait")
    assert seen["exit"] == 2 and "collecting at submit" not in seen
    assert seen["collecting after"] is True and seen["frozen"] > 10_000


def test_every_other_command_collects_while_it_works() -> None:
    seen = _main("status", "job-1")
    assert seen["exit"] == 1
    assert seen["collecting in the command"] is True and seen["frozen"] > 10_000


def test_research_leaves_at_once_with_its_output_and_exit_code() -> None:
    # `entry` ends a finished `webctx research` with os._exit: what it printed must still
    # reach its reader, and its exit code too.
    env = {**os.environ, "CELERY_BROKER_URL": "redis://127.0.0.1:9/0"}
    command = [sys.executable, "-m", "webctx.cli", "research"]
    helped = subprocess.run([*command, "--help"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert helped.returncode == 0 and "Usage" in helped.stdout and helped.stdout.endswith("\n")
    refused = subprocess.run([*command, "   "], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.startswith("error: invalid request")


@pytest.mark.parametrize("command", [["status", "abc"], ["research", "why?"], ["mcp"]])
def test_invalid_settings_are_refused_in_plain_words_naming_the_variable(
    command: list[str], tmp_path: Path
) -> None:
    env = {**os.environ, "WEBCTX_JOB_TIMEOUT_S": "soon", "WEBCTX_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "webctx.cli", *command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (
        "error: invalid settings: WEBCTX_JOB_TIMEOUT_S must be a number (got 'soon')\n"
    )
