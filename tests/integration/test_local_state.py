"""The default setup keeps its state in the user's data directory, on the local service's
Valkey: a second `webctx research` (a new process) downloads and embeds nothing, and no
client writes into the folder it was started in. (Crashes and restarts of the service:
tests/integration/test_service.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import clean_env, service_pid
from tests.testweb import LoopbackWeb
from webctx.models import Bundle

QUESTION = "how do lithium-ion batteries degrade?"


def _research(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webctx.cli", "research", QUESTION, "--max-sources", "6"],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def _pages(web: LoopbackWeb, before: dict[str, int]) -> int:
    """Requests the loopback site answered since `before` (robots.txt included)."""
    return sum(n - before.get(path, 0) for path, n in web.hits.items())


def test_a_second_research_run_downloads_and_embeds_nothing_and_writes_nothing_in_its_folder(
    test_web: LoopbackWeb, tmp_path: Path, data_dir: Path
) -> None:
    env = clean_env(**test_web.env())
    cwd = tmp_path / "project"
    cwd.mkdir()
    stats = test_web.embeddings_control.stats
    hits, tokens = dict(test_web.hits), stats.tokens
    first = _research(env, cwd)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _pages(test_web, hits) > 0 and stats.tokens > tokens
    hits, tokens = dict(test_web.hits), stats.tokens
    second = _research(env, cwd)
    assert second.returncode == 0, second.stderr[-3000:]
    assert _pages(test_web, hits) == 0  # pages, failures and robots.txt all from the cache
    assert stats.tokens == tokens
    bundle = Bundle.model_validate_json(second.stdout)
    assert bundle.stats.tokens_embedded == 0 and bundle.stats.embed_requests == 0
    assert bundle.chunks == Bundle.model_validate_json(first.stdout).chunks
    # The default max_age: each source says it came from the cache, checked by the first run.
    earlier = {s.url: s for s in Bundle.model_validate_json(first.stdout).sources}
    assert {s.retrieved for s in earlier.values()} == {"live"}
    assert bundle.sources and {s.retrieved for s in bundle.sources} == {"cached"}
    for source in bundle.sources:
        checked, downloaded = source.checked_at, earlier[source.url].checked_at
        assert checked is not None and downloaded is not None
        assert abs((checked - downloaded).total_seconds()) < 0.01
    assert list(cwd.iterdir()) == []
    assert (data_dir / "qdrant").is_dir()
    assert (data_dir / "valkey" / "appendonlydir").is_dir()
    assert service_pid(data_dir) is not None  # the local service keeps them for the next client
