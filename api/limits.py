"""Caps on what a request may carry: its body's bytes (413), its domain lists (422).

The body cap is enforced while the body is read, so a chunked body without
Content-Length is cut off at the cap instead of being buffered whole first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Annotated, Any

from pydantic import Field, StringConstraints, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from webctx.errors import InvalidRequest
from webctx.models import JobRequest
from webctx.problems import plain_message
from webctx.settings import Settings


class BodyLimit:
    """ASGI middleware: 413 for a request body over its path's cap."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, by_path: Sequence[tuple[str, int]] = ()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.by_path = list(by_path)

    def limit(self, path: str) -> int:
        """The cap for a request to `path` (the first matching prefix, else the default)."""
        for prefix, cap in self.by_path:
            if path == prefix or path.startswith(prefix + "/"):
                return cap
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.limit(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            await _send_too_large(send, cap)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    # An HTTPException: FastAPI re-raises it from its body reading (any
                    # other error there becomes a 400), the app's handler answers it.
                    raise HTTPException(413, _message(cap))
            return message

        await self.app(scope, limited, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _message(cap: int) -> str:
    return f"request body over {cap} bytes"


async def _send_too_large(send: Send, cap: int) -> None:
    """413 before reading anything (the declared Content-Length is over the cap)."""
    body = json.dumps({"error": "too_large", "message": _message(cap)}).encode()
    headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@lru_cache(maxsize=8)
def _domains(max_items: int, max_chars: int) -> TypeAdapter[list[str]]:
    entry = Annotated[str, StringConstraints(max_length=max_chars)]
    return TypeAdapter(Annotated[list[entry], Field(max_length=max_items)])


def check_request_limits(request: JobRequest, settings: Settings) -> None:
    """InvalidRequest (422) when a domain list is longer, or an entry longer, than the
    settings allow (WEBCTX_API_MAX_DOMAINS, WEBCTX_API_MAX_DOMAIN_CHARS)."""
    adapter = _domains(settings.api_max_domains, settings.api_max_domain_chars)
    errors: list[dict[str, Any]] = []
    for field in ("include_domains", "exclude_domains"):
        try:
            adapter.validate_python(getattr(request, field))
        except ValidationError as exc:
            errors += [{**e, "loc": (field, *e["loc"])} for e in exc.errors()[:3]]
    if errors:
        raise InvalidRequest("invalid request: " + plain_message(errors))
