"""`/healthz` (the process answers) and `/readyz` (its peers answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import anyio
import anyio.to_thread
import httpx
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from webctx.api.deps import RuntimeDep
from webctx.api.runtime import Runtime

router = APIRouter(tags=["health"])


class Health(BaseModel):
    """Liveness."""

    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    """Each peer's state: `ok` or the error met."""

    status: Literal["ok", "unavailable"]
    checks: dict[str, str]


@router.get("/healthz")
def healthz() -> Health:
    """Liveness: the process serves requests."""
    return Health()


@router.get("/readyz", responses={503: {"model": Readiness}})
async def readyz(runtime: RuntimeDep) -> Readiness:
    """Readiness: broker, result backend, job store and vector store reachable (else 503)."""
    checks: dict[str, str] = {}
    with anyio.move_on_after(5):
        checks = await anyio.to_thread.run_sync(check_peers, runtime)
    if not checks:
        checks = {"peers": "timed out after 5 s"}
    ready = all(v == "ok" for v in checks.values())
    body = Readiness(status="ok" if ready else "unavailable", checks=checks)
    if ready:
        return body
    return JSONResponse(body.model_dump(), status_code=503)  # type: ignore[return-value]


def check_peers(runtime: Runtime) -> dict[str, str]:
    """Probe every peer; `ok` or a short error per peer."""
    return {
        "job_store": _probe(runtime.jobs.ping),
        "broker": _probe(_ping_broker),
        "result_backend": _probe(_ping_backend),
        "vector_store": _probe(lambda: _ping_vectors(runtime)),
    }


def _probe(check: Callable[[], object]) -> str:
    try:
        check()
    except Exception as exc:  # a readiness probe reports every failure, whatever its type
        return f"{type(exc).__name__}: {exc}"[:200]
    return "ok"


def _ping_broker() -> None:
    from webctx.workers.app import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


def _ping_backend() -> None:
    from webctx.workers.app import app

    url = str(app.conf.result_backend or "")
    if url.startswith(("redis://", "rediss://")):
        import redis

        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
        finally:
            client.close()


def _ping_vectors(runtime: Runtime) -> None:
    settings = runtime.settings
    if settings.qdrant_url:
        httpx.get(settings.qdrant_url.rstrip("/") + "/readyz", timeout=2).raise_for_status()
        return
    # The embedded engine is opened by the embed/rank workers (one process per path):
    # here, only check that its directory can be created and written.
    path = settings.qdrant_path
    path.mkdir(parents=True, exist_ok=True)
    if not path.is_dir():
        raise OSError(f"{path} is not a directory")
