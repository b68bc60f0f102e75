"""A job's pages are indexed after its answer, in the local service, and that deferred
work makes way for the next question: it stops between pages while an interactive job
runs, and goes on once it is done."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_cli
from tests.integration.conftest import start_paced_web
from webctx.models import Bundle

INDEXED_AFTER = 3
"""Of the first job's six pages, at least this many need indexing (every page has more
chunks than the first pass takes of it)."""
EMBED_LATENCY_S = 3.0
"""Each embeddings request: a deferred page takes this long, and so does the next job's
first-pass embedding (so it overlaps what deferred work there is, unless that yields)."""


def _records(log: Path) -> list[dict[str, object]]:
    records = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def _indexed(log: Path, job_id: str) -> list[float]:
    """When each of the job's pages was indexed after its answer."""
    return [_at(r) for r in _records(log)
            if r.get("job_id") == job_id and r["msg"] == "page indexed after its job"]  # fmt: skip


def _at(record: dict[str, object]) -> float:
    return datetime.strptime(str(record["ts"]), "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


@pytest.mark.slow
def test_deferred_indexing_waits_while_the_next_question_runs_then_finishes(
    data_dir: Path,
) -> None:
    web = start_paced_web(0.1, embed_latency_s=EMBED_LATENCY_S)
    try:
        # The first pass takes a handful of chunks: most of every page is left to index.
        env = clean_env(
            **web.env(), WEBCTX_LOG_FORMAT="json", WEBCTX_PREFILTER__WHEN="always",
            WEBCTX_PREFILTER__CHUNKS="4", WEBCTX_PREFILTER__PER_PAGE="1",
            WEBCTX_PREFILTER__NEIGHBOURS="0",
        )  # fmt: skip
        first = run_cli(env, "research", "how do lithium-ion batteries degrade?",
                        "--max-sources", "6")  # fmt: skip
        assert first.returncode == 0, first.stderr[-3000:]
        second = run_cli(env, "research", "what is lithium plating when charging in the cold?",
                         "--max-sources", "6")  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        first_id = Bundle.model_validate_json(first.stdout).job_id
        second_id = Bundle.model_validate_json(second.stdout).job_id
        log = data_dir / "service.log"
        records = _records(log)
        ran = [_at(r) for r in records if r.get("job_id") == second_id]
        start, end = min(ran), max(ran)
        indexed = [at for at in _indexed(log, first_id) if start < at < end]
        # The page in progress when the second job came may end meanwhile; no other.
        assert len(indexed) <= 1, (start, end, _indexed(log, first_id))
        assert any(r["msg"] == "deferred work paused for interactive work" for r in records)
        # Then it goes on by itself: the first job's pages, one after the other.
        deadline = time.monotonic() + 90
        while len(_indexed(log, first_id)) < INDEXED_AFTER:
            assert time.monotonic() < deadline, _indexed(log, first_id)
            time.sleep(0.5)
        later = [at for at in _indexed(log, first_id) if at > end]
        print(f"\n[deferred] the next job ran {end - start:.1f} s with {len(indexed)} of the "
              f"first's pages indexed meanwhile; {len(later)} indexed after it")  # fmt: skip
    finally:
        web.stop()
