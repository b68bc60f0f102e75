"""The `webctx` command line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated

import redis
import typer
from kombu.exceptions import OperationalError
from pydantic import ValidationError

from webctx.errors import JobNotFound, WebctxError
from webctx.jobs import JobProgress, JobStore
from webctx.models import Bundle, JobRequest, JobStatus
from webctx.settings import get_settings
from webctx.tenants import TenantStore

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


class OutputFormat(StrEnum):
    """How a bundle is printed."""

    json = "json"
    markdown = "markdown"


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _request(
    question: str, *, max_sources: int, top_k: int, token_budget: int, max_queries: int
) -> JobRequest:
    try:
        return JobRequest(
            question=question,
            max_sources=max_sources,
            top_k=top_k,
            token_budget=token_budget,
            max_queries=max_queries,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise _fail(f"invalid request: {problems}") from exc


def _print_bundle(bundle: Bundle, fmt: OutputFormat) -> None:
    if fmt is OutputFormat.markdown:
        from webctx.stages.bundle import render_markdown

        sys.stdout.write(render_markdown(bundle) + "\n")
    else:
        sys.stdout.write(bundle.model_dump_json(indent=2) + "\n")
    sys.stdout.flush()


@cli.command()
def research(
    question: Annotated[str, typer.Argument(help="The research question.")],
    format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.json,
    max_sources: Annotated[int, typer.Option(help="Pages to fetch at most.")] = 10,
    top_k: Annotated[int, typer.Option(help="Chunks in the bundle at most.")] = 60,
    token_budget: Annotated[int, typer.Option(help="Tokens of chunk text at most.")] = 3000,
    max_queries: Annotated[int, typer.Option(help="Search queries planned at most.")] = 4,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Print the job id and exit.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds to wait for the job.")] = None,
) -> None:
    """Research a question and print its cited context bundle."""
    from workers.pipeline import submit_job

    request = _request(
        question,
        max_sources=max_sources,
        top_k=top_k,
        token_budget=token_budget,
        max_queries=max_queries,
    )
    settings = get_settings()
    wait_s = timeout if timeout is not None else settings.job_timeout_s + 30
    try:
        if settings.embedded:
            if no_wait:
                raise _fail(
                    "--no-wait needs a broker (CELERY_BROKER_URL); embedded jobs "
                    "live only as long as this command"
                )
            from workers.embedded import embedded_worker

            with embedded_worker(settings) as deps:
                job_id = submit_job(deps.jobs, request, timeout_s=settings.job_timeout_s)
                _wait_and_print(deps.jobs, job_id, format, wait_s)
            return
        from workers.deps import state_client

        jobs = JobStore(state_client(settings), ttl_s=settings.job_ttl_s)
        job_id = submit_job(jobs, request, timeout_s=settings.job_timeout_s)
        if no_wait:
            typer.echo(job_id)
            return
        _wait_and_print(jobs, job_id, format, wait_s)
    except WebctxError as exc:
        raise _fail(str(exc), code=1) from exc
    except (redis.RedisError, OperationalError) as exc:
        raise _fail(f"broker or job state store unreachable: {exc}", code=1) from exc


def _poller(jobs: JobStore, job_id: str) -> Callable[[], JobProgress]:
    """Poll the job's progress; ride out a Redis outage (the wait's timeout bounds it), and
    say so clearly when Redis came back without the job's state."""
    last = [JobProgress(job_id=job_id, status=JobStatus.QUEUED)]

    def poll() -> JobProgress:
        try:
            last[0] = jobs.progress(job_id)
        except JobNotFound as exc:
            raise WebctxError(
                f"job {job_id}: job state lost (Redis restarted without persistence?); resubmit"
            ) from exc
        except redis.RedisError:
            pass  # Redis restarting: keep the last progress until the deadline
        return last[0]

    return poll


def _wait_and_print(jobs: JobStore, job_id: str, fmt: OutputFormat, wait_s: float) -> None:
    from api.progress import wait_for_job

    progress = wait_for_job(_poller(jobs, job_id), timeout_s=wait_s)
    bundle = jobs.bundle(job_id)
    if bundle is not None:
        _print_bundle(bundle, fmt)
    if progress.status is not JobStatus.SUCCEEDED:
        raise _fail(f"job {job_id} {progress.status.value}: {progress.error or ''}", code=1)


@cli.command()
def status(job_id: str) -> None:
    """Print a job's progress as JSON (broker mode)."""
    from workers.deps import state_client

    settings = get_settings()
    try:
        progress = JobStore(state_client(settings)).progress(job_id)
    except WebctxError as exc:
        raise _fail(str(exc), code=1) from exc
    typer.echo(json.dumps({**progress.__dict__, "status": progress.status.value}))


@cli.command()
def bundle(
    job_id: str,
    format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.json,
) -> None:
    """Print a finished job's bundle (broker mode)."""
    from workers.deps import state_client

    found = JobStore(state_client(get_settings())).bundle(job_id)
    if found is None:
        raise _fail(f"job {job_id} has no bundle (unknown, expired or still running)", code=1)
    _print_bundle(found, format)


@cli.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def worker(ctx: typer.Context) -> None:
    """Start a worker: `celery -A workers.app worker` with the same options.

    Defaults to the threads pool (the stages are I/O-bound and the embedded vector
    store admits one process); pass --pool/-P to choose another.
    """
    settings = get_settings()
    if settings.embedded:
        raise _fail("set CELERY_BROKER_URL: a worker needs a broker to take jobs from")
    from workers.app import app

    args = list(ctx.args)
    if not any(a.startswith(("--pool", "-P")) for a in args):
        args += ["--pool", "threads"]
    if not any(a.startswith(("--concurrency", "-c")) for a in args):
        args += ["--concurrency", str(settings.worker_concurrency)]
    if not any(a.startswith(("--hostname", "-n")) for a in args):
        # Celery's default, celery@<host>, is the same for every worker on a host: replies
        # to `celery inspect` mix and Celery warns of duplicate node names.
        args += ["--hostname", f"webctx-{os.getpid()}@%h"]
    from celery.bin.celery import celery as celery_cli

    # As `app.start` does, but keeping the worker's exit code (click returns it, without
    # raising, when not in standalone mode, and `app.start` drops it).
    celery_cli.params[0].default = app
    code = celery_cli.main(args=["worker", *args], standalone_mode=False)
    if code:
        raise typer.Exit(code)


@cli.command()
def demo(
    question: Annotated[str, typer.Argument()] = "how do lithium-ion batteries degrade?",
    format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.markdown,
) -> None:
    """Run a full job offline against the bundled demo web, and verify its citations."""
    from webctx.demo.run import run_demo

    raise typer.Exit(run_demo(question, fmt=format.value))


@cli.command()
def api(
    host: Annotated[str | None, typer.Option(help="Bind address [WEBCTX_API_HOST].")] = None,
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
) -> None:
    """Serve the HTTP jobs API (and MCP at /mcp) with uvicorn."""
    import uvicorn

    from api.http import create_app

    settings = get_settings()
    bind = host or settings.api_host
    try:
        app = create_app(settings, host=bind)
    except WebctxError as exc:
        raise _fail(str(exc)) from exc
    if settings.log_format == "json":
        from webctx.logging import configure_logging

        configure_logging(json=True, level=settings.log_level)
        # uvicorn's own logging config would replace the JSON handler.
        uvicorn.run(app, host=bind, port=port, log_config=None)
    else:
        uvicorn.run(app, host=bind, port=port, log_level="info")


from api.batch_cli import batch as batch_app  # noqa: E402  (sub-app: webctx batch ...)

cli.add_typer(batch_app, name="batch")

keys = typer.Typer(help="Create and revoke API keys (stored hashed in the job store's Redis).")
cli.add_typer(keys, name="keys")


def _tenant_store() -> TenantStore:
    from workers.deps import state_client

    settings = get_settings()
    if not settings.state_url():
        raise _fail("API keys live in Redis: set WEBCTX_REDIS_URL or CELERY_BROKER_URL")
    return TenantStore(state_client(settings))


@keys.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant the key acts for.")],
    rate_limit: Annotated[
        int | None, typer.Option(min=1, help="Requests per minute [WEBCTX_API_RATE_LIMIT_...].")
    ] = None,
) -> None:
    """Create a key for TENANT and print it (shown once; only its hash is stored)."""
    try:
        key, record = _tenant_store().create_key(tenant, rate_limit=rate_limit)
    except WebctxError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"key id {record.key_id} for tenant {record.tenant}", err=True)
    typer.echo(key)


@keys.command("revoke")
def keys_revoke(key_or_id: Annotated[str, typer.Argument(help="The key, or its key id.")]) -> None:
    """Revoke a key: requests with it get 401 from now on."""
    if not _tenant_store().revoke(key_or_id):
        raise _fail("no such key", code=1)
    typer.echo("revoked", err=True)


@cli.command()
def mcp(
    http: Annotated[bool, typer.Option("--http", help="Streamable HTTP instead of stdio.")] = False,
    host: Annotated[str | None, typer.Option(help="Bind address with --http.")] = None,
    port: Annotated[int, typer.Option(help="Port with --http.")] = 8000,
) -> None:
    """Serve the MCP tools: stdio (default) or streamable HTTP at /mcp (API keys)."""
    if http:
        api(host=host, port=port)
        return
    from api.deps import open_runtime
    from api.mcp import run_stdio

    settings = get_settings()
    try:
        with open_runtime(settings, keys=False) as runtime:
            run_stdio(runtime)
    except WebctxError as exc:
        raise _fail(str(exc)) from exc


sources_cli = typer.Typer(help="Sources of the persistent index, re-indexed on a schedule.")
cli.add_typer(sources_cli, name="sources")
TenantOpt = Annotated[str | None, typer.Option(help="Tenant [WEBCTX_LOCAL_TENANT].")]


def _index_redis() -> redis.Redis:
    from workers.deps import state_client

    settings = get_settings()
    if not settings.state_url():
        raise _fail("the index lives in Redis: set WEBCTX_REDIS_URL or CELERY_BROKER_URL")
    return state_client(settings)


@sources_cli.command("add")
def sources_add(
    url: Annotated[str, typer.Argument(help="A page, a sitemap (or sitemap index), a feed.")],
    every: Annotated[str, typer.Option(help="Refresh interval: 30m, 6h, 1d.")] = "6h",
    kind: Annotated[str, typer.Option(help="auto, page, sitemap or feed.")] = "auto",
    tenant: TenantOpt = None,
) -> None:
    """Register a source; the next beat tick indexes it."""
    from webctx.sources import SourceRegistry, parse_interval

    if kind not in ("auto", "page", "sitemap", "feed"):
        raise _fail(f"invalid --kind {kind!r}")
    try:
        source = SourceRegistry(_index_redis()).add(
            tenant or get_settings().local_tenant, url, every_s=parse_interval(every),
            kind=kind,  # type: ignore[arg-type]
        )
    except WebctxError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(source.source_id)


@sources_cli.command("list")
def sources_list(
    format: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    tenant: TenantOpt = None,
) -> None:
    """List the tenant's sources with their last run."""
    from webctx.sources import SourceRegistry

    found = SourceRegistry(_index_redis()).list_for(tenant or get_settings().local_tenant)
    if format == "json":
        typer.echo(json.dumps([s.model_dump() for s in found], indent=2))
        return
    for s in found:
        last = s.last_report
        typer.echo(f"{s.source_id}  every {s.every_s}s  runs {s.runs}  {s.kind:7}  {s.url}"
                   f"  fetched {int(last.get('fetched', 0))}"
                   f" changed {int(last.get('changed', 0) + last.get('added', 0))}")


@sources_cli.command("remove")
def sources_remove(
    ref: Annotated[str, typer.Argument(help="Source id or URL.")], tenant: TenantOpt = None
) -> None:
    """Unregister a source and drop its pages from the index."""
    from webctx.sources import SourceRegistry

    settings = get_settings()
    source = SourceRegistry(_index_redis()).remove(tenant or settings.local_tenant, ref)
    if source is None:
        raise _fail("no such source", code=1)
    from workers.index_tasks import forget

    if settings.embedded:
        forget.run(source.tenant, source.source_id)
    else:
        forget.delay(source.tenant, source.source_id)
    typer.echo("removed", err=True)


@sources_cli.command("refresh")
def sources_refresh(
    source: Annotated[str | None, typer.Option(help="Only this source (id or URL).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait and print the reports.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 600.0,
    tenant: TenantOpt = None,
) -> None:
    """Re-index now, outside the schedule."""
    from webctx.sources import SourceRegistry
    from workers.index_tasks import start_refresh, wait_for_run

    settings = get_settings()
    r = _index_redis()
    registry = SourceRegistry(r)
    name = tenant or settings.local_tenant
    chosen = registry.list_for(name)
    if source is not None:
        chosen = [s for s in chosen if source in (s.source_id, s.url)]
    if not chosen:
        raise _fail("no sources to refresh", code=1)
    try:
        run_id = start_refresh(settings, r, chosen)
    except WebctxError as exc:
        raise _fail(str(exc), code=1) from exc
    if not wait:
        typer.echo(run_id)
        return
    status = wait_for_run(r, run_id, timeout_s=timeout)
    typer.echo(json.dumps(status, indent=2))
    if status is None or status["pending"] > 0:
        raise _fail(f"run {run_id} not finished after {timeout:.0f} s", code=1)


@cli.command("search")
def search_cmd(
    query: Annotated[str, typer.Argument(help="What to look for in the index.")],
    format: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    limit: Annotated[int, typer.Option(min=1, max=100)] = 10,
    site: Annotated[str | None, typer.Option(help="Only pages of this site.")] = None,
    source: Annotated[str | None, typer.Option(help="Only pages of this source id.")] = None,
    since: Annotated[str | None, typer.Option(help="Published on or after (YYYY-MM-DD).")] = None,
    until: Annotated[str | None, typer.Option(help="Published on or before (YYYY-MM-DD).")] = None,
    tenant: TenantOpt = None,
) -> None:
    """Hybrid (dense + BM25) search of the persistent index."""
    from workers.index_tasks import run_search

    settings = get_settings()
    _index_redis()
    filters = {"site": site, "source_id": source, "published_from": since, "published_to": until}
    try:
        hits = run_search(settings, tenant=tenant or settings.local_tenant, query=query,
                          limit=limit, filters=filters)  # fmt: skip
    except WebctxError as exc:
        raise _fail(str(exc), code=1) from exc
    if format == "json":
        typer.echo(json.dumps([h.model_dump() for h in hits], indent=2))
        return
    for n, hit in enumerate(hits, start=1):
        snippet = " ".join(hit.text.split())[:200]
        typer.echo(f"[{n}] {hit.title or hit.url}\n    {hit.url}\n    {snippet}\n")


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cli()


if __name__ == "__main__":
    main()
