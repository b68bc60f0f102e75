"""`webctx index export` / `import` through the local service, which holds the embedded
store: the file is written where the service runs, read back whole, and a cut one is
refused with nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from tests.integration.test_service import PAGE, _env
from tests.testweb import LoopbackWeb


def test_the_index_exports_and_imports_through_the_local_service(
    test_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    env = _env(test_web)
    page = test_web.site.url + PAGE
    assert run_cli(env, "sources", "add", page, "--tenant", "alpha").returncode == 0
    refreshed = run_cli(env, "sources", "refresh", "--wait", "--timeout", "120",
                        "--tenant", "alpha")  # fmt: skip
    assert refreshed.returncode == 0, refreshed.stderr[-3000:]
    dump = tmp_path / "index.jsonl.gz"
    exported = run_cli(env, "index", "export", str(dump))
    assert exported.returncode == 0, exported.stderr[-3000:]
    counts = json.loads(exported.stdout)
    assert counts["dense_points"] > 0 and counts["dense_points"] == counts["sparse_points"]
    assert counts["redis_keys"] > 0 and dump.exists()

    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(dump.read_bytes()[: dump.stat().st_size // 2])
    refused = run_cli(env, "index", "import", str(cut))
    assert refused.returncode == 1 and "truncated" in refused.stderr, refused.stderr[-3000:]

    # The same Redis and store: every key matches, the points are written again by id.
    again = run_cli(env, "index", "import", str(dump))
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout) == counts
    found = run_cli(env, "search", "SEI growth", "--format", "json", "--tenant", "alpha")
    assert found.returncode == 0, found.stderr[-3000:]
    assert page in {hit["url"] for hit in json.loads(found.stdout)}
