"""What the HTTP API and the MCP server share besides `webctx.api.runtime` (the runtime,
callers and submission, which the CLI imports without FastAPI): the request dependencies,
and waiting.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Annotated

import anyio
import anyio.to_thread
import redis
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from webctx.api.runtime import Caller, Runtime, authenticate
from webctx.jobs.store import JobProgress


def get_runtime(request: Request) -> Runtime:
    """The runtime the app's lifespan opened."""
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


# Declares the bearer scheme in the OpenAPI schema of every route that takes a caller (the
# docs' Authorize button, generated clients' auth). auto_error=False: `authenticate` answers
# a missing or wrong key itself, with the API's error body and the rate limit.
bearer_key = HTTPBearer(
    scheme_name="bearerAuth",
    description="A webctx API key (`webctx keys create --tenant NAME`): "
    "`Authorization: Bearer wctx_...`.",
    auto_error=False,
)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Security(bearer_key)]


def get_caller(runtime: RuntimeDep, bearer: BearerDep) -> Caller:
    """Dependency: authenticate the request (401/429 otherwise)."""
    return authenticate(runtime, f"Bearer {bearer.credentials}" if bearer else None)


CallerDep = Annotated[Caller, Depends(get_caller)]


WAITERS = 64
"""Threads (and state-store connections) that wait on finished signals at once, apart
from anyio's default threads: more waiting calls take turns, one interval each, and the
threads every other request runs on are never all waiting."""
_waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = (
    weakref.WeakKeyDictionary()
)


def _waiter_slots() -> anyio.CapacityLimiter:
    """The running event loop's waiter slots (a limiter belongs to one loop)."""
    loop = asyncio.get_running_loop()
    slots = _waiters.get(loop)
    if slots is None:
        slots = _waiters[loop] = anyio.CapacityLimiter(WAITERS)
    return slots


async def wait_for_finish(
    runtime: Runtime,
    job_id: str,
    *,
    timeout_s: float,
    on_progress: Callable[[JobProgress], Awaitable[None]] | None = None,
    interval_s: float = 0.2,
) -> JobProgress:
    """Follow the job until it finishes or `timeout_s` passes; returns the last snapshot.
    Between two looks (progress every `interval_s`) it waits on the job's finished
    signal, so the answer leaves as soon as the job ends, not at the next look."""
    last: JobProgress | None = None
    with anyio.move_on_after(timeout_s):
        while True:
            await anyio.to_thread.run_sync(runtime.keep_service)  # restarted if it died
            progress = await anyio.to_thread.run_sync(runtime.jobs.progress, job_id)
            if on_progress is not None and (last is None or progress != last):
                await on_progress(progress)
            last = progress
            if progress.finished:
                return progress
            await _pause(runtime, job_id, interval_s)
    return await anyio.to_thread.run_sync(runtime.jobs.progress, job_id)


async def _pause(runtime: Runtime, job_id: str, seconds: float) -> None:
    """Up to `seconds`, ended early by the job's finished signal (a plain sleep while the
    state store is down: the next look rides that out)."""
    try:
        await anyio.to_thread.run_sync(
            runtime.jobs.wait_finished, job_id, seconds, limiter=_waiter_slots()
        )
    except redis.RedisError:
        await anyio.sleep(seconds)
