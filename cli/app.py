"""The `webctx` command line (typer): every command group."""

from __future__ import annotations

import typer

from webctx.cli import jobs, serve
from webctx.cli.batch import batch
from webctx.cli.config_set import config_app
from webctx.cli.index import index
from webctx.cli.keys import keys
from webctx.cli.service import service
from webctx.cli.sources import search, sources

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
cli.command()(jobs.research)
cli.command()(jobs.status)
cli.command()(jobs.bundle)
cli.command()(jobs.cancel)
cli.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    serve.worker
)
cli.command()(serve.demo)
cli.command()(serve.api)
cli.add_typer(batch, name="batch")
cli.add_typer(keys, name="keys")
cli.command()(serve.mcp)
cli.add_typer(sources, name="sources")
cli.add_typer(service, name="service")
cli.add_typer(index, name="index")
cli.command("search")(search)
cli.add_typer(config_app, name="config")
