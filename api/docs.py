"""The docs pages' Content-Security-Policy: /docs and /redoc load only from this server.

Their scripts come from the package (fastapi-offline), but ReDoc's sidebar still shows an
image from cdn.redoc.ly; the policy makes the browser drop that request (and any a later
asset version might add) instead of sending it, so the pages never reach past the API's
own host.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DOCS_PAGES = frozenset({"/docs", "/redoc"})
# Both UIs start from an inline script and set inline styles; their icons are data: URIs;
# ReDoc's search index runs in a worker made from a blob.
DOCS_CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "worker-src 'self' blob:",
        "connect-src 'self'",
        "frame-ancestors 'self'",
    ]
)


class DocsPolicy:
    """ASGI middleware: the Content-Security-Policy header on the docs pages only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in DOCS_PAGES:
            await self.app(scope, receive, send)
            return

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["Content-Security-Policy"] = DOCS_CSP
            await send(message)

        await self.app(scope, receive, send_with_policy)
