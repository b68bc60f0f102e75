"""What the command groups share: the error exit, bundle output, the state Redis."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from webctx.models import Bundle
    from webctx.settings import Settings
    from webctx.workers.deps import StateStores


class OutputFormat(StrEnum):
    """How a bundle is printed."""

    json = "json"
    markdown = "markdown"


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `error: message` on stderr; the exit to raise (2: usage, 1: the work failed)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def print_bundle(bundle: Bundle, fmt: OutputFormat) -> None:
    """Write a bundle to stdout as JSON or Markdown."""
    if fmt is OutputFormat.markdown:
        from webctx.stages.bundle import render_markdown

        sys.stdout.write(render_markdown(bundle) + "\n")
    else:
        sys.stdout.write(bundle.model_dump_json(indent=2) + "\n")
    sys.stdout.flush()


def state_stores(settings: Settings) -> StateStores:
    """The owners of the state Redis's keys: the broker's Redis, or the local service's
    Valkey (the service started when none runs); exit 1 with the reason when unreachable."""
    from webctx.errors import WebctxError
    from webctx.workers.deps import state_stores as open_stores

    try:
        return open_stores(settings)
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
