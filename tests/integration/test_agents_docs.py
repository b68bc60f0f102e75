"""docs/agents.md, tested as written: each host's snippet is read from the page, its
variables filled in the way that host fills them, and the server started with its command,
arguments and environment (stdio), or reached at its URL with its header (streamable HTTP,
against a running `webctx api` with a key made by `webctx keys create` through the local
service); the tools it lists are webctx's. `webctx` is the checkout's console script, and
`npx` resolves the two packages the page uses to those scripts/mcp-clients installed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import ROOT, clean_env, kill_service, run_cli, stop_state_server
from tests.integration.conftest import ApiProcess, NodeClients

pytestmark = pytest.mark.anyio
PAGE = ROOT / "docs" / "agents.md"
HOSTS = {"claude-code", "claude-desktop", "cursor", "vscode", "inspector"}
DOCUMENTED_URL = "http://127.0.0.1:8000/mcp"  # `webctx api`'s default address
TOOLS = {"web_context", "web_context_batch", "get_job", "get_source", "search_index"}
INSPECTOR = "inspector/clients/launcher/build/index.js"
MARK = re.compile(r"<!-- agents: (\S+) (stdio|http) (json|shell) -->\n```\w*\n(.*?)```", re.S)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(frozen=True)
class Snippet:
    host: str
    transport: str
    form: str
    text: str


def snippets() -> list[Snippet]:
    """Every marked snippet of the page, in order."""
    return [Snippet(*m.groups()) for m in MARK.finditer(PAGE.read_text())]


@dataclass(frozen=True)
class Launch:
    """A server as a host starts or reaches it."""

    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


def _fill(value: Any, pattern: str, values: dict[str, str]) -> Any:
    """A host's variable syntax (`pattern` catches the name) filled in, recursively."""
    if isinstance(value, str):
        return re.sub(pattern, lambda m: values[m.group(1)], value)
    if isinstance(value, list):
        return [_fill(v, pattern, values) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, pattern, values) for k, v in value.items()}
    return value


def from_json(snippet: Snippet, key: str) -> Launch:
    """The `webctx` server of a host's JSON configuration, its variables filled in."""
    config = json.loads(snippet.text)
    if snippet.host == "vscode":  # servers, each with a type; secrets through inputs
        asked = {i["id"]: i for i in config.get("inputs", [])}
        assert all(i["type"] == "promptString" and i["password"] for i in asked.values())
        answers = dict.fromkeys(asked, key)
        entry = _fill(config["servers"]["webctx"], r"\$\{input:([\w-]+)\}", answers)
        assert entry.pop("type") == snippet.transport
    else:
        entry = config["mcpServers"]["webctx"]
        if snippet.host == "claude-code":  # ${VAR} from its environment
            entry = _fill(entry, r"\$\{(\w+)\}", {"WEBCTX_KEY": key})
            assert entry.pop("type") == snippet.transport
        elif snippet.host == "cursor":  # ${env:VAR}
            entry = _fill(entry, r"\$\{env:(\w+)\}", {"WEBCTX_KEY": key})
    if "url" in entry:
        return Launch(url=entry["url"], headers=tuple(entry.get("headers", {}).items()))
    env = dict(entry.get("env", {}))
    if "WEBCTX_AUTH" in env:  # the mcp-remote bridge's own variable: the key goes there
        env["WEBCTX_AUTH"] = f"Bearer {key}"
    return Launch(command=entry["command"], args=tuple(entry.get("args", [])),
                  env=tuple(env.items()))  # fmt: skip


def from_claude_mcp_add(snippet: Snippet, key: str) -> Launch:
    """`claude mcp add` parsed as Claude Code does: options, the name, then `-- command
    args...` (stdio) or the URL (http); what it writes, with ${VAR} filled in later."""
    words = shlex.split(snippet.text.strip())
    assert words[:3] == ["claude", "mcp", "add"], words
    words, rest = words[3:], []
    if "--" in words:
        words, rest = words[: words.index("--")], words[words.index("--") + 1 :]
    options: dict[str, list[str]] = {}
    while words and words[0].startswith("--"):
        options.setdefault(words[0], []).append(words[1])
        words = words[2:]
    name, *target = words
    assert name == "webctx" and options["--transport"] == [snippet.transport]
    if snippet.transport == "http":
        headers = dict(h.split(": ", 1) for h in options.get("--header", []))
        headers = _fill(headers, r"\$\{(\w+)\}", {"WEBCTX_KEY": key})
        return Launch(url=target[0], headers=tuple(headers.items()))
    env = dict(e.split("=", 1) for e in options.get("--env", []))
    return Launch(command=rest[0], args=tuple(rest[1:]), env=tuple(env.items()))


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory, node_clients: NodeClients) -> Iterator[Path]:
    """A PATH folder: `webctx` (the checkout's script) and `npx` for the page's packages;
    afterwards, the local service a host's server started in the throwaway HOME (the
    Inspector passes no WEBCTX_DATA_DIR: the server takes the user's data directory) is
    stopped."""
    folder = tmp_path_factory.mktemp("bin")
    (folder / "webctx").symlink_to(Path(sys.executable).parent / "webctx")
    remote = node_clients.modules / "mcp-remote" / "dist" / "proxy.js"
    if not remote.exists():
        pytest.skip("no mcp-remote in the MCP clients: run scripts/mcp-clients")
    inspector = node_clients.modules / "@modelcontextprotocol" / INSPECTOR
    npx = folder / "npx"
    npx.write_text(
        "#!/bin/sh\n[ \"$1\" = -y ] && shift\npackage=$1; shift\ncase $package in\n"
        f'  mcp-remote) exec "{node_clients.node}" "{remote}" "$@" ;;\n'
        f'  @modelcontextprotocol/inspector) exec "{node_clients.node}" "{inspector}" "$@" ;;\n'
        '  *) echo "npx: $package is not one the tests installed" >&2; exit 127 ;;\nesac\n'
    )
    npx.chmod(0o755)
    yield folder
    users = folder.parent / "home" / ".local" / "share" / "webctx"
    kill_service(users)
    stop_state_server(users)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, dict[str, str]]]:
    """`webctx api` with no broker (the local service holds the key) and a key."""
    tmp = tmp_path_factory.mktemp("agents")
    env = clean_env(WEBCTX_DATA_DIR=str(tmp / "data"), WEBCTX_EMBEDDING_PROVIDER="hash")
    created = run_cli(env, "keys", "create", "--tenant", "agents")
    assert created.returncode == 0, created.stderr[-3000:]
    process = ApiProcess(env, tmp / "api.log")
    try:
        process.wait_ready()
        yield process.url, created.stdout.strip(), env
    finally:
        process.stop()
        subprocess.run([sys.executable, "-m", "webctx.cli", "service", "stop"], env=env,
                       cwd=ROOT, capture_output=True, timeout=60, check=False)  # fmt: skip


def _host_env(base: dict[str, str], shims: Path, extra: dict[str, str]) -> dict[str, str]:
    home = shims.parent / "home"
    home.mkdir(exist_ok=True)
    return {**base, "PATH": f"{shims}{os.pathsep}{base.get('PATH', '')}", "HOME": str(home),
            **extra}  # fmt: skip


async def _tools(launch: Launch, *, api_url: str, env: dict[str, str]) -> set[str]:
    if launch.url is not None:
        assert launch.url == DOCUMENTED_URL, launch.url
        http = httpx2.AsyncClient(headers=dict(launch.headers), timeout=httpx2.Timeout(60))
        client = Client(streamable_http_client(f"{api_url}/mcp", http_client=http))
    else:
        args = [a.replace(DOCUMENTED_URL, f"{api_url}/mcp") for a in launch.args]
        params = StdioServerParameters(command=launch.command or "", args=args,
                                       env={**env, **dict(launch.env)}, cwd=str(ROOT))  # fmt: skip
        client = Client(params, read_timeout_seconds=120)
    async with client:
        return {t.name for t in (await client.list_tools()).tools}


def test_the_page_configures_every_host_over_stdio_and_http() -> None:
    found = {(s.host, s.transport) for s in snippets()}
    assert found == {(h, t) for h in HOSTS for t in ("stdio", "http")}


@pytest.mark.parametrize(
    "snippet",
    [s for s in snippets() if s.host != "inspector"],
    ids=lambda s: f"{s.host}-{s.transport}-{s.form}",
)
async def test_a_hosts_snippet_starts_or_reaches_webctx(
    snippet: Snippet, api: tuple[str, str, dict[str, str]], shims: Path
) -> None:
    api_url, key, env = api
    parse = from_claude_mcp_add if snippet.form == "shell" else from_json
    launch = parse(snippet, key)
    host_env = _host_env(env, shims, {})
    assert await _tools(launch, api_url=api_url, env=host_env) == TOOLS


def test_claude_codes_command_writes_what_its_json_says() -> None:
    by = {(s.host, s.transport, s.form): s for s in snippets()}
    for transport in ("stdio", "http"):
        shell = from_claude_mcp_add(by["claude-code", transport, "shell"], "k")
        assert shell == from_json(by["claude-code", transport, "json"], "k"), transport


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_inspector_command_lists_the_tools(
    transport: str, api: tuple[str, str, dict[str, str]], shims: Path
) -> None:
    api_url, key, env = api
    snippet = next(s for s in snippets() if (s.host, s.transport) == ("inspector", transport))
    # What the shell does with the line: words, and $WEBCTX_KEY inside double quotes.
    words = [w.replace(DOCUMENTED_URL, f"{api_url}/mcp").replace("$WEBCTX_KEY", key)
             for w in shlex.split(snippet.text.strip())]  # fmt: skip
    host_env = _host_env(env, shims, {"NO_COLOR": "1", "MCP_INSPECTOR_SECRET_STORE": "memory"})
    done = subprocess.run(words, env=host_env, cwd=ROOT, capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert {t["name"] for t in json.loads(done.stdout)["tools"]} == TOOLS
