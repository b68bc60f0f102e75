"""`webctx batch`: submit a JSONL file of questions, follow it, read its results, cancel it."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TextIO

import redis
import typer
from kombu.exceptions import OperationalError

from webctx.cli.common import fail, state_stores
from webctx.errors import InvalidRequest, WebctxError
from webctx.jobs.batch_items import BatchItem, parse_items
from webctx.jobs.batches import BatchStatus, BatchStore
from webctx.settings import Settings, get_settings

batch = typer.Typer(help="Batches: thousands of questions from a JSONL file, resumable.")


class StatusFormat(StrEnum):
    """How `batch status` prints."""

    json = "json"
    text = "text"


def describe(s: BatchStatus) -> str:
    """One progress line: counts, rate, ETA."""
    elapsed = float(s.stats.get("elapsed_s", 0.0)) or 0.0
    rate = (s.done + s.failed) / elapsed * 60 if elapsed else 0.0
    eta = f"{s.eta_s:.0f}s" if s.eta_s is not None else "?"
    return (
        f"batch {s.id[:8]} {s.state}: done {s.done}, failed {s.failed}, running {s.running}, "
        f"queued {s.queued} of {s.total} · {rate:.1f} q/min · ETA {eta}"
    )


def _read_items(path: Path, token_budget: int | None, max_sources: int | None) -> list[BatchItem]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read {path}: {exc}") from exc
    try:
        return parse_items(lines, token_budget=token_budget, max_sources=max_sources)
    except WebctxError as exc:
        raise fail(f"{path}: {exc}") from exc


@contextmanager
def _batches(settings: Settings) -> Iterator[BatchStore]:
    """The batch store of broker mode (batch state lives in Redis)."""
    stores = state_stores(settings)
    try:
        yield stores.batches
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    except (redis.RedisError, OperationalError) as exc:
        raise fail(f"broker or job state store unreachable: {exc}", code=1) from exc
    finally:
        stores.close()


@batch.command("submit")
def submit(
    file: Annotated[
        Path,
        typer.Argument(
            help="JSONL: {id, question, ...}: any field of a job request (docs/batch.md)"
        ),
    ],
    name: Annotated[str, typer.Option(help="Batch name: the same name and file, the same batch.")],
    token_budget: Annotated[int | None, typer.Option(help="Default for items.")] = None,
    max_sources: Annotated[int | None, typer.Option(help="Default for items.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait, then write the results.")] = False,
    out: Annotated[
        Path | None, typer.Option(help="Results JSONL with --wait (default stdout).")
    ] = None,
) -> None:
    """Submit a batch and print its id; with --wait, wait for every item and write results."""
    from webctx.workers.batch import feed_batch, submit_batch

    items = _read_items(file, token_budget, max_sources)  # refused before anything is queued
    settings = get_settings()
    tenant = settings.local_tenant
    with _batches(settings) as store:
        batch_id, created = submit_batch(store, settings, tenant, name, items)
        if not created:
            typer.echo(f"batch {name!r} exists with the same items: resuming it", err=True)
        typer.echo(batch_id, err=wait and out is None)
        if wait:
            _wait_and_write(store, settings, batch_id, out, feed_batch)


def _wait_and_write(
    store: BatchStore,
    settings: Settings,
    batch_id: str,
    out: Path | None,
    feed: Callable[[BatchStore, Settings, str], int],
) -> None:
    price = settings.batch.price_per_1k_tokens

    def poll() -> BatchStatus:
        if settings.embedded:  # the local service restarted if it stopped
            from webctx.workers.service_client import ensure_service

            ensure_service(settings.data_dir)
        feed(store, settings, batch_id)  # a waiting client also moves the batch (lost ticks)
        return store.status(batch_id, price_per_1k_tokens=price)

    outage_s = settings.job_timeout_s
    status = _follow(_through_outages(poll, give_up_after_s=outage_s, stream=sys.stderr),
                     sys.stderr)  # fmt: skip
    _write_results(store, batch_id, out)
    typer.echo(json.dumps({"batch": batch_id, **_summary(status)}), err=True)
    if status.state == "cancelled":
        raise fail(f"batch {batch_id} was cancelled", code=1)


def _through_outages(
    poll: Callable[[], BatchStatus],
    *,
    give_up_after_s: float,
    stream: TextIO,
    interval_s: float = 1.0,
) -> Callable[[], BatchStatus]:
    """`poll`, retried while Redis is unreachable (a restart, a failover), as `webctx
    research` waits; the error goes on once Redis has been away `give_up_after_s`."""

    def guarded() -> BatchStatus:
        down_since: float | None = None
        while True:
            try:
                status = poll()
            except (redis.RedisError, OperationalError) as exc:
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    print(f"job state store unreachable, still waiting: {exc}", file=stream,
                          flush=True)  # fmt: skip
                if now - down_since > give_up_after_s:
                    raise
                time.sleep(interval_s)
                continue
            if down_since is not None:
                print("job state store reachable again", file=stream, flush=True)
            return status

    return guarded


def _summary(status: BatchStatus) -> dict[str, object]:
    return {"state": status.state, "done": status.done, "failed": status.failed,
            "cancelled": status.cancelled, "stats": status.stats}  # fmt: skip


def _follow(
    poll: Callable[[], BatchStatus], stream: TextIO, interval_s: float = 1.0
) -> BatchStatus:
    """Poll until the batch finishes: a live line on a TTY, a line per change otherwise."""
    if stream.isatty():
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        with Live(Text("starting…"), console=Console(file=stream), refresh_per_second=4) as live:
            while not (status := poll()).finished:
                live.update(Text(describe(status)))
                time.sleep(interval_s)
            live.update(Text(describe(status)))
            return status
    last = ""
    while True:
        status = poll()
        line = describe(status).split(" · ")[0]
        if line != last:
            print(describe(status), file=stream, flush=True)
            last = line
        if status.finished:
            return status
        time.sleep(interval_s)


def _write_results(store: BatchStore, batch_id: str, out: Path | None) -> int:
    count = 0
    handle = out.open("w", encoding="utf-8") if out else sys.stdout
    try:
        for record in store.results(batch_id):
            handle.write(json.dumps(record) + "\n")
            count += 1
    finally:
        if out:
            handle.close()
        else:
            handle.flush()
    return count


BatchRef = Annotated[
    str, typer.Argument(help="The batch's id, or a unique prefix of it (4 characters at least).")
]


def _batch_id(store: BatchStore, settings: Settings, ref: str) -> str:
    """The batch `ref` names: its id, or a unique prefix of one of the local tenant's
    batches' ids (exit 2 for one too short or shared, 1 when no batch has it)."""
    try:
        return store.resolve(settings.local_tenant, ref)
    except InvalidRequest as exc:
        raise fail(str(exc)) from exc


@batch.command("status")
def status(
    batch_id: BatchRef,
    format: Annotated[StatusFormat, typer.Option("--format", "-f")] = StatusFormat.json,
) -> None:
    """Print a batch's counts, ETA and accounting."""
    from webctx.workers.batch import feed_batch

    settings = get_settings()
    with _batches(settings) as store:
        batch_id = _batch_id(store, settings, batch_id)
        feed_batch(store, settings, batch_id)
        found = store.status(batch_id, price_per_1k_tokens=settings.batch.price_per_1k_tokens)
    if format is StatusFormat.text:
        typer.echo(describe(found))
    else:
        typer.echo(json.dumps(found.as_dict()))


@batch.command("results")
def results(
    batch_id: BatchRef,
    out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
) -> None:
    """Write one JSONL line per finished item, in input order."""
    settings = get_settings()
    with _batches(settings) as store:
        count = _write_results(store, _batch_id(store, settings, batch_id), out)
    typer.echo(f"{count} results", err=True)


@batch.command("cancel")
def cancel(batch_id: BatchRef) -> None:
    """Cancel a batch: queued items never start, running ones stop."""
    settings = get_settings()
    with _batches(settings) as store:
        batch_id = _batch_id(store, settings, batch_id)
        store.cancel(batch_id)
        typer.echo(describe(store.status(batch_id)), err=True)
