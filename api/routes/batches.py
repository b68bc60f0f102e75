"""`/v1/batches`: submit a batch (JSONL or a JSON list), status, streamed results, cancel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Path, Query, Request, Response, status
from fastapi.responses import StreamingResponse

from webctx.api.deps import CallerDep, RuntimeDep
from webctx.api.limits import check_request_limits
from webctx.api.routes.jobs import ERRORS
from webctx.api.runtime import Runtime
from webctx.errors import BatchNotFound, InvalidBatch, InvalidRequest
from webctx.jobs.batch_items import BatchItem, json_list_lines, parse_items
from webctx.jobs.batches import BatchStatus, BatchStore

router = APIRouter(prefix="/v1", tags=["batches"])
BatchId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="A batch id.")]


def _items(body: bytes, token_budget: int | None, max_sources: int | None) -> list[BatchItem]:
    """A JSON list of items, or JSONL; InvalidBatch (422) names bad items/lines."""
    text = body.decode("utf-8", errors="replace")
    if text.lstrip().startswith("["):
        lines = json_list_lines(text)  # item N is reported as line N
        return parse_items(lines, token_budget=token_budget, max_sources=max_sources)
    return parse_items(text.splitlines(), token_budget=token_budget, max_sources=max_sources)


def _status(runtime: Runtime, batch_id: str) -> BatchStatus:
    price = runtime.settings.batch.price_per_1k_tokens
    return runtime.stores.batches.status(batch_id, price_per_1k_tokens=price)


def _owned(runtime: Runtime, tenant: str, batch_id: str) -> BatchStore:
    store = runtime.stores.batches
    if store.tenant(batch_id) != tenant:
        raise BatchNotFound(batch_id)
    return store


@router.post(
    "/batches",
    status_code=status.HTTP_202_ACCEPTED,
    responses=ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/x-ndjson": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
            },
        }
    },
)
async def create_batch(
    request: Request,
    response: Response,
    caller: CallerDep,
    runtime: RuntimeDep,
    name: Annotated[str, Query(min_length=1, max_length=200)],
    token_budget: Annotated[int | None, Query(ge=50, le=100_000)] = None,
    max_sources: Annotated[int | None, Query(ge=1, le=100)] = None,
) -> BatchStatus:
    """Submit a batch: JSONL lines or a JSON list of {id, question, ...job fields}.

    The same name and items return the same batch (nothing finished is redone); the same
    name with other items is 409.
    """
    body = await request.body()  # at most WEBCTX_BATCH__MAX_BODY_BYTES (api/limits.py)
    items = _items(body, token_budget, max_sources)
    for item in items:  # items take the job fields, so the API's domain-list caps too
        try:
            check_request_limits(item.request, runtime.settings)
        except InvalidRequest as exc:
            raise InvalidBatch(f"invalid batch: item {item.id!r}: {exc}") from exc

    def submit() -> tuple[str, bool]:
        from webctx.workers.batch import submit_batch

        return submit_batch(runtime.stores.batches, runtime.settings, caller.tenant, name, items)

    batch_id, created = await anyio.to_thread.run_sync(submit)
    response.headers["Location"] = f"/v1/batches/{batch_id}"
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return await anyio.to_thread.run_sync(_status, runtime, batch_id)


@router.get("/batches/{batch_id}", responses=ERRORS)
def read_batch(batch_id: BatchId, caller: CallerDep, runtime: RuntimeDep) -> BatchStatus:
    """Counts (queued, running, done, failed), ETA, and accounting of a batch."""
    from webctx.workers.batch import feed_batch

    _owned(runtime, caller.tenant, batch_id)
    feed_batch(runtime.stores.batches, runtime.settings, batch_id)  # reading also moves a batch
    return _status(runtime, batch_id)


@router.get(
    "/batches/{batch_id}/results",
    responses={
        **ERRORS,
        200: {
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            "description": "One JSON line per finished item.",
        },
    },  # fmt: skip
)
def read_results(batch_id: BatchId, caller: CallerDep, runtime: RuntimeDep) -> StreamingResponse:
    """One JSONL line per finished item, in input order: {id, bundle} or {id, error}."""
    store = _owned(runtime, caller.tenant, batch_id)

    def lines() -> Iterator[str]:
        for record in store.results(batch_id):
            yield json.dumps(record) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.delete("/batches/{batch_id}", responses=ERRORS)
def cancel_batch(batch_id: BatchId, caller: CallerDep, runtime: RuntimeDep) -> BatchStatus:
    """Cancel a batch: queued items never start, running items are cancelled."""
    _owned(runtime, caller.tenant, batch_id).cancel(batch_id)
    return _status(runtime, batch_id)
