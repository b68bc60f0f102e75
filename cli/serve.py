"""`webctx worker`, `webctx api`, `webctx mcp`, `webctx demo`: the long-running processes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Annotated

import typer

from webctx.cli.common import OutputFormat, fail
from webctx.errors import WebctxError
from webctx.settings import Settings, get_settings


def worker(ctx: typer.Context) -> None:
    """Start a worker: `celery -A webctx.workers.app worker` with the same options.

    Defaults to the threads pool (the stages are I/O-bound and the embedded vector
    store admits one process); pass --pool/-P to choose another. Mingle and gossip are off,
    as in the local service: webctx tracks live workers itself (workers/liveness.py), the one
    task it may revoke (an index search nobody consumed) expires, and mingle held every start
    for a second asking for neighbours.
    """
    args = list(ctx.args)
    settings = apply_concurrency(args)
    if settings.embedded:
        raise fail("set CELERY_BROKER_URL: a worker needs a broker to take jobs from")
    from webctx.workers.app import app

    if not any(a.startswith(("--pool", "-P")) for a in args):
        args += ["--pool", "threads"]
    if not any(a.startswith(("--concurrency", "-c")) for a in args):
        args += ["--concurrency", str(settings.worker_concurrency)]
    if not any(a.startswith(("--hostname", "-n")) for a in args):
        # Celery's default, celery@<host>, is the same for every worker on a host: replies
        # to `celery inspect` mix and Celery warns of duplicate node names.
        args += ["--hostname", f"webctx-{os.getpid()}@%h"]
    for flag in ("--without-mingle", "--without-gossip"):
        if flag not in args:
            args.append(flag)
    from celery.bin.celery import celery as celery_cli

    # As `app.start` does, but keeping the worker's exit code (click returns it, without
    # raising, when not in standalone mode, and `app.start` drops it).
    celery_cli.params[0].default = app
    code = celery_cli.main(args=["worker", *args], standalone_mode=False)
    if code:
        raise typer.Exit(code)


def concurrency_arg(args: Sequence[str]) -> int | None:
    """The thread count given to Celery (`-c N`, `-cN`, `--concurrency N`,
    `--concurrency=N`), or None."""
    for i, arg in enumerate(args):
        value: str | None = None
        if arg in ("-c", "--concurrency"):
            value = args[i + 1] if i + 1 < len(args) else None
        elif arg.startswith("--concurrency="):
            value = arg.partition("=")[2]
        elif arg.startswith("-c") and not arg.startswith("--"):
            value = arg[2:]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None  # Celery says what is wrong with it
    return None


def apply_concurrency(args: Sequence[str]) -> Settings:
    """The settings, with a thread count given on the command line as the worker's
    concurrency: the fetch pool is sized from it (one download per thread in flight), and
    would otherwise stay at WEBCTX_WORKER_CONCURRENCY's."""
    given = concurrency_arg(args)
    if given is not None and given > 0 and given != get_settings().worker_concurrency:
        os.environ["WEBCTX_WORKER_CONCURRENCY"] = str(given)
        get_settings.cache_clear()
    return get_settings()


def demo(
    question: Annotated[str, typer.Argument()] = "how do lithium-ion batteries degrade?",
    format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.markdown,
) -> None:
    """Run a full job offline against the bundled demo web, and verify its citations."""
    from webctx.demo.run import run_demo

    raise typer.Exit(run_demo(question, fmt=format.value))


def api(
    host: Annotated[str | None, typer.Option(help="Bind address [WEBCTX_API_HOST].")] = None,
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
) -> None:
    """Serve the HTTP jobs API (and MCP at /mcp) with uvicorn."""
    import uvicorn

    from webctx.api.http import create_app

    settings = get_settings()
    bind = host or settings.api_host
    try:
        app = create_app(settings, host=bind)
    except WebctxError as exc:
        raise fail(str(exc)) from exc
    if settings.log_format == "json":
        from webctx.logging import configure_logging

        configure_logging(json=True, level=settings.log_level)
        # uvicorn's own logging config would replace the JSON handler.
        uvicorn.run(app, host=bind, port=port, log_config=None)
    else:
        uvicorn.run(app, host=bind, port=port, log_level="info")


def mcp(
    http: Annotated[bool, typer.Option("--http", help="Streamable HTTP instead of stdio.")] = False,
    host: Annotated[str | None, typer.Option(help="Bind address with --http.")] = None,
    port: Annotated[int, typer.Option(help="Port with --http.")] = 8000,
) -> None:
    """Serve the MCP tools: stdio (default) or streamable HTTP at /mcp (API keys)."""
    if http:
        api(host=host, port=port)
        return
    from webctx.api.mcp import run_stdio
    from webctx.api.runtime import open_runtime

    settings = get_settings()
    try:
        with open_runtime(settings) as runtime:
            runtime.warm()  # the first tool call's job submission then loads nothing
            run_stdio(runtime)
    except WebctxError as exc:
        raise fail(str(exc)) from exc
