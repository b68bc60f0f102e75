"""Settings that follow the user: an MCP host's minimal environment reads the config file,
and no job runs on the local service under settings its caller did not have (the idle
service is restarted with the caller's; a busy one refuses)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import clean_env, run_cli, service_pid
from tests.integration.conftest import start_paced_web
from tests.testweb import LoopbackWeb
from webctx.devweb.searxng import make_searxng_app, searxng_control
from webctx.devweb.server import LoopbackServer

QUESTION = "how do lithium-ion batteries degrade?"


@pytest.fixture
def other_search() -> Iterator[LoopbackServer]:
    """A SearxNG nobody asked for: it answers nothing, and counts who asks."""
    server = LoopbackServer(make_searxng_app([])).start()
    yield server
    server.stop()


def _asked(search: LoopbackServer) -> int:
    return searxng_control(search.app).requests  # type: ignore[arg-type]


def _minimal_env(home: Path, data_dir: Path, **extra: str) -> dict[str, str]:
    """What an MCP host passes: PATH and HOME (and here the test's data directory)."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "WEBCTX_DATA_DIR": str(data_dir),
            **extra}  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_mcp_server_started_with_a_minimal_environment_searches_with_the_config_file(
    test_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # `webctx config set`, run as the user would in a terminal: the file lands in the
    # platform's config folder under HOME.
    for name, value in test_web.env().items():
        done = run_cli({**_minimal_env(home, data_dir)}, "config", "set", name, value)
        assert done.returncode == 0, done.stderr
    config = home / ".config" / "webctx" / "config.toml"
    assert config.exists() and config.stat().st_mode & 0o777 == 0o600
    log = tmp_path / "mcp-stderr.log"
    # A mistyped variable in the host's JSON: warned of on stderr, stdout stays the protocol.
    command = f"exec {shlex.quote(sys.executable)} -m webctx.cli mcp 2>>{shlex.quote(str(log))}"
    params = StdioServerParameters(
        command="/bin/sh", args=["-c", command], cwd=str(tmp_path),
        env=_minimal_env(home, data_dir, WEBCTX_SEARXNG_ULR="http://127.0.0.1:9"),
    )  # fmt: skip
    asked = _asked(test_web.search)
    async with Client(params, read_timeout_seconds=150) as client:
        result = await client.call_tool(
            "web_context", {"question": QUESTION, "max_sources": 4, "wait_s": 110}
        )
    assert not result.is_error, result.content
    sources = result.structured_content["sources"]
    assert sources and all(s["url"].startswith(test_web.site.url) for s in sources)
    assert _asked(test_web.search) > asked  # the file's SearxNG, not DuckDuckGo
    warned = [line for line in log.read_text().splitlines() if "WEBCTX_SEARXNG_ULR" in line]
    assert warned == ["warning: WEBCTX_SEARXNG_ULR is not a webctx setting (ignored); "
                      "did you mean WEBCTX_SEARXNG_URL?"]  # fmt: skip
    # The service the MCP server started has the file's settings too: `webctx config`
    # with that same environment says where each came from.
    shown = run_cli(_minimal_env(home, data_dir), "config", "--json")
    rows = {row["env"]: row for row in json.loads(shown.stdout)}
    assert rows["WEBCTX_SEARXNG_URL"]["source"] == "file"
    assert rows["OPENAI_API_KEY"] == {"env": "OPENAI_API_KEY", "path": "openai_api_key",
                                      "value": "****", "source": "file"}  # fmt: skip


def test_a_client_with_other_settings_restarts_the_idle_service_with_its_own(
    test_web: LoopbackWeb, other_search: LoopbackServer, data_dir: Path
) -> None:
    mine = clean_env(**test_web.env())
    theirs = {**mine, "WEBCTX_SEARXNG_URL": other_search.url}
    # Their job ended (no results there): its deadline watchdog, held by the service for
    # ten minutes, is no work that keeps the service from being restarted.
    theirs_done = run_cli(theirs, "research", QUESTION, "--max-sources", "4")
    assert theirs_done.returncode == 1 and "no results" in theirs_done.stderr
    first = service_pid(data_dir)
    asked = _asked(other_search)
    assert asked > 0
    done = run_cli(mine, "research", QUESTION, "--max-sources", "4", "-f", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    restarted = [line for line in done.stderr.splitlines() if "restarted the local service" in line]
    assert len(restarted) == 1 and "WEBCTX_SEARXNG_URL differed" in restarted[0]
    assert json.loads(done.stdout)["sources"]
    second = service_pid(data_dir)
    assert second is not None and second != first
    assert _asked(other_search) == asked  # nothing of this job went where it was not asked to
    # Same settings now: the next question is handed to the restarted service as is.
    again = run_cli(mine, "research", QUESTION, "--max-sources", "4", "--no-wait")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "restarted" not in again.stderr and service_pid(data_dir) == second


def test_a_client_with_other_settings_is_refused_while_the_service_runs_a_job(
    other_search: LoopbackServer, data_dir: Path
) -> None:
    web = start_paced_web(delay_s=6.0)  # the first job takes a while: 2 pages at a time
    try:
        slow = {"WEBCTX_FETCH__TOTAL_TIMEOUT_S": "30", "WEBCTX_FETCH__READ_TIMEOUT_S": "30"}
        first = clean_env(**{**web.env(), **slow})
        submitted = run_cli(first, "research", QUESTION, "--max-sources", "4", "--no-wait")
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        job_id = submitted.stdout.strip()
        pid = service_pid(data_dir)
        other = {**first, "WEBCTX_SEARXNG_URL": other_search.url, "OPENAI_API_KEY": "sk-other"}
        refused = run_cli(other, "research", QUESTION, "--no-wait")
        assert refused.returncode == 1
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, refused.stderr
        assert lines[0].startswith("error: refused: the local service")
        assert "OPENAI_API_KEY, WEBCTX_SEARXNG_URL differ" in lines[0]
        assert "sk-other" not in lines[0] and other_search.url not in lines[0]  # names only
        assert _asked(other_search) == 0 and service_pid(data_dir) == pid
        # The first caller's job was not disturbed.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = json.loads(run_cli(first, "status", job_id).stdout)
            if status["status"] not in ("queued", "running"):
                break
            time.sleep(0.5)
        assert status["status"] == "succeeded", status
    finally:
        web.stop()


def test_a_mistyped_variable_is_warned_of_once_by_every_command(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_SEARXNG_ULR="http://127.0.0.1:9")
    warning = ("warning: WEBCTX_SEARXNG_ULR is not a webctx setting (ignored); "
               "did you mean WEBCTX_SEARXNG_URL?")  # fmt: skip
    for args in (["service", "status"], ["config", "path"], ["service", "start"]):
        done = run_cli(env, *args)
        warned = [line for line in done.stderr.splitlines() if "WEBCTX_SEARXNG_ULR" in line]
        assert warned == [warning], (args, done.stderr)
    # `webctx research` handed to the running service (just started), before
    # this process loads the settings, hears it from the service.
    assert service_pid(data_dir) is not None
    handed = run_cli(env, "research", QUESTION, "--max-sources", "2", "--no-wait")
    assert handed.returncode == 0, handed.stderr[-3000:]
    assert [line for line in handed.stderr.splitlines() if "ULR" in line] == [warning]
