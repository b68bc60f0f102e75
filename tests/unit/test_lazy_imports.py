"""Heavy clients load only in the processes that use them: every worker, CLI command and
API process starts often (scaling, tests, one CLI call per question), and the OpenAI client
alone costs about half a second of CPU to import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(modules: list[str], heavy: tuple[str, ...]) -> list[str]:
    """Which of `heavy` a new interpreter has loaded after importing `modules`."""
    script = (
        f"import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    )
    return _run(script)


def _run(script: str) -> Any:
    """The JSON a script prints last, run in a new interpreter."""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "modules",
    [
        ["webctx.workers.app", "webctx.workers.tasks"],
        ["webctx.cli.main", "webctx.workers.pipeline"],
        ["webctx.api.http"],
    ],
)
def test_starting_a_process_loads_no_openai_client(modules: list[str]) -> None:
    assert _loaded_after(modules, ("openai", "torch", "onnxruntime")) == []


def test_the_openai_embedder_still_reaches_its_endpoint_lazily() -> None:
    from webctx.adapters.openai_embedder import OpenAIEmbedder
    from webctx.errors import ProviderUnavailable

    embedder = OpenAIEmbedder(base_url="http://127.0.0.1:9/v1", api_key=None, model="m",
                              timeout_s=2)  # fmt: skip
    with pytest.raises(ProviderUnavailable, match="APIConnectionError"):
        embedder.embed(["x"])
    embedder.close()


def test_the_research_command_loads_no_web_framework_numpy_or_live_display() -> None:
    """`webctx research` imports what it runs (submission, the job store, the wait), not
    FastAPI, numpy (vectors are handled by the workers) or rich's live display (a terminal
    only): every question's CLI call pays their ~60-90 ms each before the job starts."""
    modules = ["webctx.cli.main", "webctx.cli.app", "webctx.api.runtime",
               "webctx.workers.pipeline", "webctx.cli.progress"]  # fmt: skip
    assert _loaded_after(modules, ("fastapi", "webctx.api.deps", "numpy", "rich.live")) == []


def test_building_the_openai_embedder_loads_its_client_only_when_warmed() -> None:
    """A worker builds its embedder before consuming; the client's ~0.5 s import then
    waits for `warm()` (a background thread once the worker consumes) or the first embed,
    instead of delaying the job's first tasks."""
    script = (
        "import json, sys\n"
        "from webctx.adapters.openai_embedder import OpenAIEmbedder\n"
        "e = OpenAIEmbedder(base_url='http://127.0.0.1:9/v1', api_key=None, model='m')\n"
        "built = 'openai' in sys.modules\n"
        "e.warm()\n"
        "print(json.dumps([built, 'openai' in sys.modules]))\n"
        "e.close()\n"
    )
    assert _run(script) == [False, True]


def test_only_a_worker_that_runs_its_embed_tasks_itself_warms_the_embedder() -> None:
    from celery.concurrency.prefork import TaskPool as Prefork
    from celery.concurrency.solo import TaskPool as Solo
    from celery.concurrency.thread import TaskPool as Threads

    from webctx.workers.app import warms_embedder

    assert warms_embedder({"fetch", "embed"}, Threads)
    assert warms_embedder({"rank"}, Solo)
    # A prefork parent runs no task; children forked after it loaded a model in process
    # would inherit the model without its thread pool.
    assert not warms_embedder({"embed", "rank"}, Prefork)
    assert not warms_embedder({"fetch", "search"}, Threads)
