"""`webctx service`: the local service of the data directory (started on demand by every
local client; these commands run, start, stop and inspect it by hand)."""

from __future__ import annotations

import json

import typer

from webctx.cli.common import fail
from webctx.errors import WebctxError
from webctx.settings import get_settings

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
    from webctx.workers.service import run_service

    settings = get_settings()
    configure_logging(json=settings.log_format == "json", level=settings.log_level)
    # Loaded here, once: the inbox's thread and the worker would otherwise import them at
    # the same moment.
    import webctx.api.runtime  # noqa: F401
    import webctx.workers.app  # noqa: F401

    # The inbox reads `webctx research` command lines as typed, too (webctx/cli/handover.py).
    lines = CommandLines(parse=request_of_argv, warm=warm_research_parser, warnings=names_warnings)
    inbox = partial(serve_inbox, settings, command_lines=lines)
    raise typer.Exit(run_service(settings, inbox=(INBOX_KEY, inbox)))


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
    """Stop the service (its queued tasks wait in its Valkey for the next start)."""
    _local()
    from webctx.workers.service_client import stop_service

    pid = stop_service(get_settings().data_dir)
    typer.echo("not running" if pid is None else f"stopped {pid}", err=True)


@service.command("status")
def service_status() -> None:
    """Print the running service's pid and socket as JSON; exit 1 when none runs."""
    _local()
    from webctx.workers.service_client import running_service

    settings = get_settings()
    info = running_service(settings.data_dir)
    if info is None:
        typer.echo(json.dumps({"running": False, "data_dir": str(settings.data_dir)}))
        raise typer.Exit(1)
    typer.echo(json.dumps({"running": True, "pid": info.pid, "socket": info.socket,
                           "data_dir": str(settings.data_dir)}))  # fmt: skip
