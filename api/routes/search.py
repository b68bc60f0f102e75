"""`GET /v1/search`: hybrid (dense + BM25, fused by RRF) search of the tenant's index."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import anyio.to_thread
from celery.exceptions import TimeoutError as CeleryTimeout
from fastapi import APIRouter, Query

from webctx.api.deps import CallerDep, RuntimeDep
from webctx.api.routes.jobs import ERRORS
from webctx.errors import ProviderUnavailable
from webctx.index.search import IndexHit

router = APIRouter(prefix="/v1", tags=["index"])


@router.get("/search", responses=ERRORS)
async def search(
    runtime: RuntimeDep,
    caller: CallerDep,
    q: Annotated[str, Query(min_length=1, max_length=2000, description="The query.")],
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
    site: Annotated[str | None, Query(max_length=255, description="Only this site.")] = None,
    source: Annotated[
        str | None, Query(pattern=r"^[0-9a-f]{16}$", description="Only this source id.")
    ] = None,
    published_from: Annotated[dt.date | None, Query(description="Published on/after.")] = None,
    published_to: Annotated[dt.date | None, Query(description="Published on/before.")] = None,
) -> list[IndexHit]:
    """The best chunks of the caller's indexed pages for `q`, with their pages' metadata."""
    from webctx.workers.index_client import run_search

    filters = {
        "site": site,
        "source_id": source,
        "published_from": published_from.isoformat() if published_from else None,
        "published_to": published_to.isoformat() if published_to else None,
    }
    try:
        return await anyio.to_thread.run_sync(
            lambda: run_search(
                runtime.settings, tenant=caller.tenant, query=q, limit=limit, filters=filters
            )  # fmt: skip
        )
    except CeleryTimeout as exc:
        raise ProviderUnavailable("index search: no worker answered in time") from exc
