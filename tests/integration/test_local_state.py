"""The embedded default keeps its state in the user's data directory, on a real Valkey
server started as a child process: a second `webctx research` downloads and embeds
nothing, no client writes into the folder it was started in, and a crashed run leaves
nothing that blocks the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, clean_env
from tests.testweb import LoopbackWeb
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.models import Bundle

QUESTION = "how do lithium-ion batteries degrade?"


def _research(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webctx.cli", "research", QUESTION, "--max-sources", "6"],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def _server_pid(data_dir: Path) -> int | None:
    try:
        pid = int((data_dir / "valkey" / "valkey.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


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
    assert _server_pid(data_dir) is None  # stopped with the run that started it


def test_a_run_after_a_crash_recovers_the_server_and_its_state(
    test_web: LoopbackWeb, tmp_path: Path, data_dir: Path
) -> None:
    env = clean_env(**test_web.env())
    log = (tmp_path / "killed.log").open("wb")
    killed = subprocess.Popen(
        [sys.executable, "-m", "webctx.cli", "research", QUESTION, "--max-sources", "6"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while _server_pid(data_dir) is None and time.monotonic() < deadline:
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        time.sleep(0.05)
    server = _server_pid(data_dir)
    assert server is not None
    os.killpg(killed.pid, signal.SIGKILL)  # the starter dies; its server (own session) lives
    killed.wait(timeout=10)
    log.close()
    assert _server_pid(data_dir) == server
    reused = _research(env, tmp_path)
    assert reused.returncode == 0, reused.stderr[-3000:]
    assert _server_pid(data_dir) is None  # the last one out stopped it
    # A crash of both leaves a socket and a pid file that nothing answers on.
    again = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (data_dir / "valkey" / "valkey.sock").touch()
    (data_dir / "valkey" / "valkey.pid").write_text(f"{again.pid}\n")  # a live, wrong pid
    try:
        hits = dict(test_web.hits)
        recovered = _research(env, tmp_path)
    finally:
        again.kill()
        again.wait()
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert _pages(test_web, hits) == 0  # the state came back from the append-only file
    assert Bundle.model_validate_json(recovered.stdout).stats.tokens_embedded == 0


def test_a_run_while_another_process_holds_the_store_uses_a_temporary_one(
    test_web: LoopbackWeb, tmp_path: Path, data_dir: Path
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = clean_env(**test_web.env(), TMPDIR=str(scratch))
    holder = EdgeVectorStore(data_dir / "qdrant")  # another local client, still running
    try:
        done = _research(env, tmp_path)
    finally:
        holder.close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "this run uses a temporary one" in done.stderr
    assert Bundle.model_validate_json(done.stdout).chunks
    assert list(scratch.iterdir()) == []  # the temporary store is gone with the run
