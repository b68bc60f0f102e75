"""`/v1/sources`: the tenant's indexed sources, and re-index runs outside the schedule."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Path, Response, status
from pydantic import BaseModel, Field

from webctx.api.deps import CallerDep, RuntimeDep
from webctx.api.routes.jobs import ERRORS
from webctx.errors import JobNotFound
from webctx.index.sources import Source, parse_interval

router = APIRouter(prefix="/v1", tags=["index"])
SourceRef = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="A source id.")]
RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="A re-index run id.")]


class SourceIn(BaseModel):
    """A source to index: a page, a sitemap or a feed, refreshed `every` (30m, 6h, 1d)."""

    url: str = Field(min_length=8, max_length=4000, pattern=r"^https?://")
    every: str = Field(default="6h", max_length=16)
    kind: Literal["auto", "page", "sitemap", "feed"] = "auto"


class RefreshIn(BaseModel):
    """Which sources to re-index now (all of the tenant's when empty)."""

    source_ids: list[Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]] = Field(
        default_factory=list, max_length=1000
    )


class RunOut(BaseModel):
    """A re-index run: sources still pending and each finished source's report."""

    run_id: str
    pending: int
    tenant: str = ""
    sources: dict[str, dict[str, Any]] = Field(default_factory=dict)


@router.post("/sources", status_code=status.HTTP_201_CREATED, responses=ERRORS)
async def add_source(body: SourceIn, runtime: RuntimeDep, caller: CallerDep) -> Source:
    """Register (or update) a source; the next schedule tick indexes it."""
    from webctx.workers.deps import check_source_url

    every_s = parse_interval(body.every)
    registry = runtime.stores.sources

    def add() -> Source:
        check_source_url(runtime.settings, body.url)  # may resolve the host: off the loop
        return registry.add(caller.tenant, body.url, every_s=every_s, kind=body.kind)

    return await anyio.to_thread.run_sync(add)


@router.get("/sources", responses=ERRORS)
async def list_sources(runtime: RuntimeDep, caller: CallerDep) -> list[Source]:
    """The caller's sources with their last run."""
    return await anyio.to_thread.run_sync(runtime.stores.sources.list_for, caller.tenant)


@router.delete("/sources/{source_id}", status_code=204, responses=ERRORS)
async def remove_source(source_id: SourceRef, runtime: RuntimeDep, caller: CallerDep) -> Response:
    """Unregister a source; its pages leave the index."""
    from webctx.workers.index_client import forget_source

    source = await anyio.to_thread.run_sync(runtime.stores.sources.remove, caller.tenant, source_id)
    if source is None:
        raise JobNotFound(source_id)
    await anyio.to_thread.run_sync(lambda: forget_source(source.tenant, source.source_id))
    return Response(status_code=204)


@router.post("/sources/refresh", status_code=status.HTTP_202_ACCEPTED, responses=ERRORS)
async def refresh_sources(body: RefreshIn, runtime: RuntimeDep, caller: CallerDep) -> RunOut:
    """Re-index now, outside the schedule; poll the run for the reports."""
    from webctx.workers.index_client import start_refresh

    stores = runtime.stores
    chosen = await anyio.to_thread.run_sync(stores.sources.list_for, caller.tenant)
    if body.source_ids:
        chosen = [s for s in chosen if s.source_id in set(body.source_ids)]
    run_id = await anyio.to_thread.run_sync(
        lambda: start_refresh(stores.runs, caller.tenant, chosen, settings=runtime.settings)
    )
    found = await anyio.to_thread.run_sync(stores.runs.status, run_id)
    return RunOut.model_validate(found or {"run_id": run_id, "pending": 0})


@router.get("/sources/runs/{run_id}", responses=ERRORS)
async def read_run(run_id: RunId, runtime: RuntimeDep, caller: CallerDep) -> RunOut:
    """A re-index run's progress and reports."""
    found = await anyio.to_thread.run_sync(runtime.stores.runs.status, run_id)
    if found is None or found["tenant"] != caller.tenant:
        raise JobNotFound(run_id)
    return RunOut.model_validate(found)
