"""`POST /v1/context`: submit a job and wait for its bundle, up to a timeout."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse
from pydantic import Field

from webctx.api.deps import CallerDep, RuntimeDep, wait_for_finish
from webctx.api.routes.jobs import (
    ERRORS,
    JobOut,
    JobSubmit,
    OutputFormat,
    finished_bundle,
    job_out,
    markdown_response,
)
from webctx.api.runtime import submit
from webctx.errors import Conflict, ProviderDown
from webctx.models import Bundle

router = APIRouter(prefix="/v1", tags=["context"])


class ContextRequest(JobSubmit):
    """A research job to wait for."""

    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=600,
        description="Seconds to wait (capped by WEBCTX_API_CONTEXT_TIMEOUT_S). On timeout "
        "the answer is 202 with the job's status; the job goes on.",
    )


@router.post(
    "/context",
    responses={
        **ERRORS,
        200: {
            "content": {"text/markdown": {"schema": {"type": "string"}}},
            "description": "The finished job's bundle (JSON, or Markdown if format=markdown); "
            "a failed job's lists its failures.",
        },
        202: {"model": JobOut, "description": "Not finished within the timeout."},
    },
)
async def research_context(
    body: ContextRequest,
    response: Response,
    caller: CallerDep,
    runtime: RuntimeDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Bundle:
    """Research a question and return its bundle in one call (for short jobs)."""
    request = body.to_request()
    job_id, _ = await anyio.to_thread.run_sync(
        lambda: submit(runtime, caller, request, idempotency_key=idempotency_key)
    )
    response.headers["X-Webctx-Job-Id"] = job_id
    timeout_s = min(body.timeout_s, runtime.settings.api_context_timeout_s)
    progress = await wait_for_finish(runtime, job_id, timeout_s=timeout_s)
    if progress.reason == ProviderDown.reason:  # no bundle to give: the provider's outage
        raise ProviderDown("provider", progress.error or "a provider is down")
    found = await anyio.to_thread.run_sync(finished_bundle, runtime, progress)
    if found is None and progress.finished:  # cancelled: no bundle, as GET .../bundle says
        raise Conflict(f"job {job_id} is {progress.status.value}: it has no bundle")
    if found is None:
        out = job_out(progress, fmt=body.format)
        headers = {"Location": out.links.status, "X-Webctx-Job-Id": job_id}
        return JSONResponse(out.model_dump(mode="json"), 202, headers=headers)  # type: ignore[return-value]
    if body.format is OutputFormat.markdown:
        md = markdown_response(found)
        md.headers["X-Webctx-Job-Id"] = job_id
        return md  # type: ignore[return-value]
    return found
