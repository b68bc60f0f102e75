"""`webctx sources` and `webctx search`: the persistent index from the shell."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from webctx.cli.common import fail, state_stores
from webctx.errors import WebctxError
from webctx.settings import get_settings

if TYPE_CHECKING:
    from webctx.settings import Settings
    from webctx.workers.deps import StateStores

sources = typer.Typer(help="Sources of the persistent index, re-indexed on a schedule.")
TenantOpt = Annotated[str | None, typer.Option(help="Tenant [WEBCTX_LOCAL_TENANT].")]


def _index_stores() -> StateStores:
    return state_stores(get_settings())


@sources.command("add")
def sources_add(
    url: Annotated[str, typer.Argument(help="A page, a sitemap (or sitemap index), a feed.")],
    every: Annotated[str, typer.Option(help="Refresh interval: 30m, 6h, 1d; 5m at least.")] = "6h",
    kind: Annotated[str, typer.Option(help="auto, page, sitemap or feed.")] = "auto",
    tenant: TenantOpt = None,
) -> None:
    """Register a source; the next beat tick indexes it."""
    from webctx.index.sources import parse_interval
    from webctx.workers.deps import check_source_url

    if kind not in ("auto", "page", "sitemap", "feed"):
        raise fail(f"invalid --kind {kind!r}")
    try:
        check_source_url(get_settings(), url)
        source = _index_stores().sources.add(
            tenant or get_settings().local_tenant,
            url,
            every_s=parse_interval(every),
            kind=kind,  # type: ignore[arg-type]
        )
    except WebctxError as exc:
        raise fail(str(exc)) from exc
    typer.echo(source.source_id)


@sources.command("list")
def sources_list(
    format: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    tenant: TenantOpt = None,
) -> None:
    """List the tenant's sources with their last run."""
    found = _index_stores().sources.list_for(tenant or get_settings().local_tenant)
    if format == "json":
        typer.echo(json.dumps([s.model_dump() for s in found], indent=2))
        return
    for s in found:
        last = s.last_report
        typer.echo(
            f"{s.source_id}  every {s.every_s}s  runs {s.runs}  {s.kind:7}  {s.url}"
            f"  fetched {int(last.get('fetched', 0))}"
            f" changed {int(last.get('changed', 0) + last.get('added', 0))}"
        )


@sources.command("remove")
def sources_remove(
    ref: Annotated[str, typer.Argument(help="Source id or URL.")], tenant: TenantOpt = None
) -> None:
    """Unregister a source and drop its pages from the index."""
    settings = get_settings()
    source = _index_stores().sources.remove(tenant or settings.local_tenant, ref)
    if source is None:
        raise fail("no such source", code=1)
    from webctx.workers.index_client import forget_source

    forget_source(source.tenant, source.source_id)
    typer.echo("removed", err=True)


@sources.command("refresh")
def sources_refresh(
    source: Annotated[str | None, typer.Option(help="Only this source (id or URL).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait and print the reports.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 600.0,
    tenant: TenantOpt = None,
) -> None:
    """Re-index now, outside the schedule."""
    from webctx.workers.index_client import start_refresh

    settings = get_settings()
    stores = _index_stores()
    name = tenant or settings.local_tenant
    chosen = stores.sources.list_for(name)
    if source is not None:
        chosen = [s for s in chosen if source in (s.source_id, s.url)]
    if not chosen:
        raise fail("no sources to refresh", code=1)
    try:
        run_id = start_refresh(stores.runs, name, chosen, settings=settings)
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    if not wait:
        typer.echo(run_id)
        return
    status = stores.runs.wait(run_id, timeout_s=timeout, poll=_keep_service(settings))
    typer.echo(json.dumps(status, indent=2))
    if status is None or status["pending"] > 0:
        raise fail(f"run {run_id} not finished after {timeout:.0f} s", code=1)


def _keep_service(settings: Settings) -> Callable[[], object]:
    """What a waiting client calls each poll: restart the local service if it stopped."""
    from webctx.workers.service_client import ensure_service

    return lambda: ensure_service(settings.data_dir) if settings.embedded else None


def search(
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
    from webctx.workers.index_client import run_search

    settings = get_settings()
    _index_stores()
    filters = {"site": site, "source_id": source, "published_from": since, "published_to": until}
    try:
        hits = run_search(settings, tenant=tenant or settings.local_tenant, query=query,
                          limit=limit, filters=filters)  # fmt: skip
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    if format == "json":
        typer.echo(json.dumps([h.model_dump() for h in hits], indent=2))
        return
    for n, hit in enumerate(hits, start=1):
        snippet = " ".join(hit.text.split())[:200]
        typer.echo(f"[{n}] {hit.title or hit.url}\n    {hit.url}\n    {snippet}\n")
