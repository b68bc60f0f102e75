"""`webctx service`: the local service of the data directory (started on demand by every
local client; these commands run, start, stop and inspect it by hand)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from webctx.cli.common import fail
from webctx.errors import WebctxError
from webctx.settings import get_settings

if TYPE_CHECKING:
    from webctx.workers.strays import Stray

service = typer.Typer(
    help="The local service (no CELERY_BROKER_URL): Valkey, the vector store and the workers."
)


def _local() -> None:
    if not get_settings().embedded:
        raise fail("CELERY_BROKER_URL is set: there is no local service, workers serve the broker")


@service.command("run")
def service_run() -> None:
    """Run the service in the foreground (exits 0 at once when one already runs)."""
    _local()
    from functools import partial

    from webctx.api.inbox import INBOX_KEY, CommandLines, serve_inbox
    from webctx.cli.config import names_warnings
    from webctx.cli.jobs import request_of_argv, warm_research_parser
    from webctx.logging import configure_logging
    from webctx.workers.service import exit_now, run_service

    settings = get_settings()
    configure_logging(json=settings.log_format == "json", level=settings.log_level)
    # Loaded here, once: the inbox's thread and the worker would otherwise import them at
    # the same moment.
    import webctx.api.runtime  # noqa: F401
    import webctx.workers.app  # noqa: F401

    # The inbox reads `webctx research` command lines as typed, too (webctx/cli/handover.py).
    lines = CommandLines(parse=request_of_argv, warm=warm_research_parser, warnings=names_warnings)
    inbox = partial(serve_inbox, settings, command_lines=lines)
    exit_now(run_service(settings, inbox=(INBOX_KEY, inbox)))


@service.command("start")
def service_start() -> None:
    """Start the service in the background unless it runs; print its pid and socket."""
    _local()
    from webctx.workers.service_client import ensure_service

    try:
        info = ensure_service(get_settings().data_dir)
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    typer.echo(json.dumps({"pid": info.pid, "socket": info.socket}))


@service.command("stop")
def service_stop() -> None:
    """Stop the service: its running tasks go back to their queues at once, its queued ones
    wait in its Valkey for the next start; then end whatever else of the data directory
    still runs (a Valkey or a child a killed service left)."""
    _local()
    from webctx.workers.service_client import stop_service

    stopped = stop_service(get_settings().data_dir)
    if stopped.pid is None and not stopped.left:
        typer.echo("not running", err=True)
        return
    if stopped.pid is not None:
        how = "killed" if stopped.killed else "stopped"
        typer.echo(f"{how} {stopped.pid} in {stopped.seconds:.1f} s", err=True)
    for stray in stopped.left:
        typer.echo(f"ended {_describe(stray)}", err=True)


@service.command("status")
def service_status() -> None:
    """Print the service's pid and socket, and every process of the data directory, as
    JSON; exit 1 when no service runs (`strays`: what a dead service left running)."""
    _local()
    from webctx.workers.service_client import running_service, service_holder
    from webctx.workers.strays import directory_processes

    settings = get_settings()
    info = running_service(settings.data_dir)
    holder = info.pid if info is not None else service_holder(settings.data_dir)
    processes = directory_processes(settings.data_dir, socket=Path(info.socket) if info else None)
    # The service's own: itself and its children (Valkey, the extraction processes).
    strays = [p for p in processes if holder is None or holder not in (p.pid, p.ppid)]
    listed = [{"pid": p.pid, "kind": p.kind, "ppid": p.ppid, "age_s": p.age_s} for p in processes]
    status = {"running": info is not None, "data_dir": str(settings.data_dir)}
    if info is not None:
        status.update(pid=info.pid, socket=info.socket)
    elif holder is not None:
        status.update(starting=holder)
    status.update(processes=listed, strays=[p.pid for p in strays])
    typer.echo(json.dumps(status))
    for stray in strays:
        typer.echo(f"left running without a service: {_describe(stray)} "
                   "(`webctx service stop` ends it)", err=True)  # fmt: skip
    if info is None:
        raise typer.Exit(1)


def _describe(process: Stray) -> str:
    names = {"valkey": "valkey-server", "service": "webctx service run", "child": "process"}
    age = _age(process.age_s)
    return f"{names[process.kind]} {process.pid} (running {age}, parent {process.ppid})"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
