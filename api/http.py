"""The HTTP API: FastAPI app factory, error mapping, and the mounted MCP endpoint.

    webctx api --host 127.0.0.1 --port 8000
    uvicorn --factory webctx.api.http:create_app    # or gunicorn -k uvicorn.workers.UvicornWorker

OpenAPI at /openapi.json, docs at /docs (Swagger UI) and /redoc, MCP (streamable HTTP)
at /mcp. The docs pages load their scripts from this server, never from a CDN
(fastapi-offline ships them), and a Content-Security-Policy keeps them on it (api/docs.py):
they work on a network without internet access.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from webctx.api.docs import DocsPolicy
from webctx.api.limits import BodyLimit
from webctx.api.runtime import Runtime, check_auth_setting, open_runtime
from webctx.errors import (
    ConfigError,
    Conflict,
    FetchError,
    InvalidRequest,
    JobNotFound,
    ProviderDown,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TooManyJobs,
    TooManyRequests,
    TransientError,
    Unauthorized,
    WebctxError,
)
from webctx.models import JobRequest
from webctx.problems import plain_problems
from webctx.settings import Settings, get_settings
from webctx.workers.app import app as celery_app
from webctx.workers.metrics import observe_api

logger = logging.getLogger(__name__)

# The one mapping of the error tree to HTTP: (status, code). First match wins.
_STATUS: list[tuple[type[WebctxError], int, str]] = [
    (Unauthorized, 401, "unauthorized"),
    (TooManyJobs, 429, "too_many_jobs"),
    (TooManyRequests, 429, "rate_limited"),
    (QuotaExceeded, 403, "quota_exceeded"),
    (JobNotFound, 404, "not_found"),
    (Conflict, 409, "conflict"),
    (InvalidRequest, 422, "invalid_request"),
    (ProviderDown, 503, "provider_down"),
    (RateLimited, 503, "provider_rate_limited"),
    (TransientError, 503, "unavailable"),
    (ConfigError, 503, "misconfigured"),
    (ProviderError, 502, "provider_error"),
    (FetchError, 502, "fetch_error"),
]


def error_response(exc: WebctxError) -> JSONResponse:
    """The HTTP response for an error of the webctx tree."""
    status, code = 500, "internal"
    for cls, cls_status, cls_code in _STATUS:
        if isinstance(exc, cls):
            status, code = cls_status, cls_code
            break
    headers: dict[str, str] = {}
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="webctx"'
    if isinstance(exc, TooManyRequests):
        headers["Retry-After"] = str(exc.retry_after_s)
    if status >= 500:
        logger.warning("request failed", extra={"error": type(exc).__name__, "exc": str(exc)})
    return JSONResponse({"error": code, "message": str(exc)}, status, headers=headers)


def _validation_body(errors: Sequence[Any]) -> dict[str, Any]:
    """A 422's body: the problems in plain words, and each as `detail` (where, what kind,
    the sentence) for programs."""
    schema = JobRequest.model_json_schema()  # the job knobs' ranges, for "between a and b"
    sentences = plain_problems(errors, schema)
    detail = [{"loc": list(err.get("loc", ())), "type": err.get("type", ""), "msg": sentence}
              for err, sentence in zip(errors, sentences, strict=True)]  # fmt: skip
    message = "invalid request: " + "; ".join(sentences[:10])
    return {"error": "invalid_request", "message": message, "detail": detail}


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(WebctxError)
    async def _webctx(_: Request, exc: WebctxError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_body(list(exc.errors())), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        code = codes.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": code, "message": str(exc.detail)}, exc.status_code, headers=exc.headers
        )


class McpAuth:
    """ASGI guard in front of the MCP endpoint: the same keys and rate limit as /v1."""

    def __init__(self, app: StreamableHTTPASGIApp, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from webctx.api.runtime import authenticate

        if scope["type"] == "http":
            runtime: Runtime = self.fastapi_app.state.runtime
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            try:
                await anyio.to_thread.run_sync(authenticate, runtime, headers.get("authorization"))
            except WebctxError as exc:
                await error_response(exc)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(settings: Settings | None = None, *, host: str | None = None) -> FastAPI:
    """The API app; `host` is the bind address (default WEBCTX_API_HOST) for the auth switch."""
    from webctx.api.mcp import build_mcp
    from webctx.api.routes import batches, context, health, jobs, oauth, sources
    from webctx.api.routes import search as index_search

    settings = settings or get_settings()
    check_auth_setting(settings, host or settings.api_host)
    mcp_server = build_mcp(lambda: app.state.runtime)
    mcp_server.streamable_http_app(host=host or settings.api_host)  # creates its session manager

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            runtime = await anyio.to_thread.run_sync(
                lambda: stack.enter_context(open_runtime(settings))
            )
            app.state.runtime = runtime
            runtime.warm()  # the first job's submission then loads nothing
            await stack.enter_async_context(mcp_server.session_manager.run())
            yield

    app = FastAPIOffline(
        title="webctx",
        version="1",
        summary="Research questions into cited, web-grounded context bundles.",
        lifespan=lifespan,
    )
    app.add_middleware(DocsPolicy)
    _install_handlers(app)
    # A batch is many questions in one body; everything else is one small JSON object.
    batch_cap = [("/v1/batches", settings.batch.max_body_bytes)]
    app.add_middleware(BodyLimit, max_bytes=settings.api_max_body_bytes, by_path=batch_cap)
    app.include_router(jobs.router)
    app.include_router(context.router)
    app.include_router(batches.router)
    app.include_router(sources.router)
    app.include_router(index_search.router)
    app.include_router(health.router)
    app.include_router(oauth.router)  # OAuth discovery answers: keys, not OAuth (docs/api.md)
    guard = McpAuth(StreamableHTTPASGIApp(mcp_server.session_manager), app)
    app.router.routes.append(Route("/mcp", endpoint=guard, methods=["GET", "POST", "DELETE"]))
    observe_api(app, celery_app)  # GET /metrics (jobs, queue depths), traces with WEBCTX_OTEL
    return app
