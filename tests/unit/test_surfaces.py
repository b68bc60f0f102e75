"""One job contract on every surface: each `JobRequest` field can be set from the CLI,
the HTTP API, the MCP `web_context` tool and a batch item. A field added to `JobRequest`
fails here until every surface takes it (or the exclusion lists below say why not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import redis
import typer.main
from mcp import Client

from tests.conftest import ROOT, clean_env, redis_url, run_cli
from webctx.api.http import create_app
from webctx.api.mcp import build_mcp
from webctx.api.runtime import Runtime
from webctx.cli.app import cli
from webctx.jobs.batch_items import parse_item
from webctx.knobs import default, knobs_table
from webctx.models import JobRequest
from webctx.settings import Settings
from webctx.workers.deps import stores_on

FIELDS = set(JobRequest.model_fields)

# Fields a surface deliberately lacks, each with the reason. Empty today: every surface
# takes every field. Add a name here only with a comment that says why.
CLI_EXCLUDED: set[str] = set()
API_EXCLUDED: set[str] = set()
MCP_EXCLUDED: set[str] = set()
BATCH_EXCLUDED: set[str] = set()

# Options a surface has that are not job fields (how to wait, how to print).
# idempotency_key: on the API it is the Idempotency-Key header, not a body field.
CLI_ONLY = {"format", "no_wait", "timeout", "idempotency_key"}
API_ONLY = {"format", "timeout_s"}
MCP_ONLY = {"wait_s"}


def test_cli_research_has_an_option_for_every_job_field() -> None:
    command = typer.main.get_command(cli)
    assert isinstance(command, typer.core.TyperGroup)
    research = command.commands["research"]
    params = {p.name for p in research.params}
    assert FIELDS - CLI_EXCLUDED - params == set(), "job fields missing from the CLI"
    assert params - FIELDS == CLI_ONLY


def test_openapi_request_bodies_have_every_job_field() -> None:
    app = create_app(Settings(api_auth="required"), host="127.0.0.1")
    schema = app.openapi()
    for path, extra in (("/v1/jobs", set()), ("/v1/context", {"timeout_s"})):
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        name = body["schema"]["$ref"].rsplit("/", 1)[-1]
        properties = set(schema["components"]["schemas"][name]["properties"])
        assert FIELDS - API_EXCLUDED - properties == set(), f"job fields missing from {path}"
        assert properties - FIELDS == {"format"} | extra
        assert properties - FIELDS <= API_ONLY


def _no_runtime() -> Runtime:
    raise AssertionError("listing tools needs no runtime")


def test_mcp_web_context_tool_has_every_job_field() -> None:
    async def schema() -> dict[str, Any]:
        async with Client(build_mcp(_no_runtime)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
        return tools["web_context"].input_schema

    properties = set(anyio.run(schema)["properties"])
    assert FIELDS - MCP_EXCLUDED - properties == set(), "job fields missing from web_context"
    assert properties - FIELDS == MCP_ONLY


def test_batch_item_sets_every_job_field() -> None:
    values: dict[str, Any] = {
        "question": "how do heat pumps work?",
        "max_sources": 3,
        "top_k": 7,
        "token_budget": 900,
        "max_queries": 2,
        "include_domains": ["energy.example"],
        "exclude_domains": ["spam.example"],
        "recency_days": 30,
        "max_age": 0,
        "stale_if_error": True,
        "depth": "deep",
    }
    assert set(values) == FIELDS - BATCH_EXCLUDED, "give the new field a non-default value"
    defaults = JobRequest(question="q").model_dump()
    assert all(values[k] != defaults[k] for k in values if k != "question")
    item, error = parse_item({"id": "a", **values})
    assert error is None and item is not None
    assert item.request.model_dump() == values


def test_batch_item_with_an_unknown_field_is_refused() -> None:
    item, error = parse_item({"id": 1, "question": "q", "max_source": 3})
    assert item is None and error == "unknown field(s) ['max_source'] (id 1)"


def test_cli_research_options_reach_the_submitted_job(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # --no-wait only queues the job: no worker is needed to read back what was submitted.
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    done = run_cli(env, "research", "how do heat pumps work?", "--no-wait",
                   "--max-sources", "3", "--top-k", "7", "--token-budget", "900",
                   "--max-queries", "2", "--include-domain", "energy.example",
                   "--include-domain", "heat.example", "--exclude-domain", "spam.example",
                   "--recency-days", "30", "--max-age", "0", "--stale-if-error",
                   "--depth", "deep")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = stores_on(redis_client, Settings()).jobs
    submitted = jobs.request(done.stdout.strip()).model_dump()
    assert submitted == {
        "question": "how do heat pumps work?", "max_sources": 3, "top_k": 7,
        "token_budget": 900, "max_queries": 2,
        "include_domains": ["energy.example", "heat.example"],
        "exclude_domains": ["spam.example"], "recency_days": 30, "max_age": 0,
        "stale_if_error": True, "depth": "deep",
    }  # fmt: skip


def test_every_surface_refuses_a_domain_that_is_not_a_host_name_naming_it(
    tmp_path: Path,
) -> None:
    bad = "javascript:alert(1)"
    why = f"{bad!r} is not a host name"

    async def tool() -> str:
        async with Client(build_mcp(_no_runtime)) as client:  # refused before any runtime
            result = await client.call_tool(
                "web_context", {"question": "q", "include_domains": ["ok.example", bad]}
            )
        assert result.is_error
        return str(result.content[0].text)  # type: ignore[union-attr]

    assert f"include_domains[1]: {why}" in anyio.run(tool)
    item, error = parse_item({"id": "a", "question": "q", "exclude_domains": [bad]})
    assert item is None and error is not None and why in error
    env = clean_env(CELERY_BROKER_URL="redis://127.0.0.1:9/0",  # refused before it connects
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"))  # fmt: skip
    done = run_cli(env, "research", "q", "--exclude-domain", bad, "--no-wait")
    assert done.returncode == 2 and f"exclude_domains[0]: {why}" in done.stderr


def _bounds(prop: dict[str, Any]) -> tuple[Any, Any]:
    branches = [prop, *prop.get("anyOf", [])]
    low = next((b["minimum"] for b in branches if "minimum" in b), None)
    high = next((b["maximum"] for b in branches if "maximum" in b), None)
    return low, high


def test_every_surface_reads_its_defaults_and_ranges_from_the_one_table() -> None:
    """JobRequest's fields are the table: the CLI's option defaults, the MCP tool's schema
    and the HTTP API's schema give the same default and range for each knob."""
    table = JobRequest.model_json_schema()["properties"]
    command = typer.main.get_command(cli)
    research = {p.name: p for p in command.commands["research"].params}  # type: ignore[attr-defined]

    async def tool_schema() -> dict[str, Any]:
        async with Client(build_mcp(_no_runtime)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
        return tools["web_context"].input_schema

    mcp = anyio.run(tool_schema)["properties"]
    app = create_app(Settings(api_auth="required"), host="127.0.0.1")
    http = app.openapi()["components"]["schemas"]["JobSubmit"]["properties"]
    for name in ("max_sources", "top_k", "token_budget", "max_queries", "recency_days"):
        want = (table[name].get("default"), _bounds(table[name]))
        assert research[name].default == want[0], f"CLI --{name}"  # JobRequest checks it
        assert (mcp[name].get("default"), _bounds(mcp[name])) == want, f"MCP {name}"
        assert (http[name].get("default"), _bounds(http[name])) == want, f"HTTP {name}"
        assert mcp[name]["description"] == table[name]["description"] == http[name]["description"]
    assert default("max_sources") == 10  # the MCP tool used to fetch 8


def test_the_api_docs_show_the_knobs_table_as_it_is() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    shown = text.split("| knob | default | range | what |\n|---|---|---|---|\n", 1)[1]
    shown = shown.split("\n<!-- /knobs -->", 1)[0]
    assert shown == knobs_table(), f"docs/api.md's knobs table is stale; now:\n{knobs_table()}"


def test_every_surface_refuses_an_unknown_depth_naming_the_two(tmp_path: Path) -> None:
    async def tool() -> str:
        async with Client(build_mcp(_no_runtime)) as client:  # refused before any runtime
            result = await client.call_tool("web_context", {"question": "q", "depth": "deeper"})
        assert result.is_error
        return str(result.content[0].text)  # type: ignore[union-attr]

    said = anyio.run(tool)
    assert "depth" in said and "'fast'" in said and "'deep'" in said, said
    item, error = parse_item({"id": "a", "question": "q", "depth": "deeper"})
    assert item is None and error is not None and "depth" in error and "'deep'" in error
    env = clean_env(CELERY_BROKER_URL="redis://127.0.0.1:9/0",  # refused before it connects
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"))  # fmt: skip
    done = run_cli(env, "research", "q", "--depth", "deeper", "--no-wait")
    assert done.returncode == 2 and "depth" in done.stderr and "'deep'" in done.stderr
    app = create_app(Settings(api_auth="required"), host="127.0.0.1")
    http = app.openapi()["components"]["schemas"]["JobSubmit"]["properties"]["depth"]
    assert http["enum"] == ["fast", "deep"] and http["default"] == "fast"
