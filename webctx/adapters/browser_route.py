"""Every request a rendering browser makes, answered by us through the fetch guard.

The browser is launched unable to resolve any name and every request of its context is
intercepted (`BrowserContext.route("**/*")`): this module sends it with the guarded httpx
client (scheme, URL, port and each resolved address checked, as for the fetcher) and
fulfils the browser's request with the answer. So the browser itself never opens a
connection: a redirect is handed back as the 3xx it is (the browser asks again for the
new URL, which passes here again), a refused request is aborted, and the bytes of one
page's responses together are capped.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from webctx.adapters.guarded_transport import checked_url, redirect_location
from webctx.adapters.http_body import BodyDecoder
from webctx.errors import FetchError

if TYPE_CHECKING:  # playwright is the optional `render` extra
    from playwright.async_api import Route

logger = logging.getLogger(__name__)

# Hop-by-hop and framing headers: the client sets its own, the browser gets decoded bodies.
_DROPPED_REQUEST = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection",
     "te", "accept-encoding", "content-length"}
)  # fmt: skip
_DROPPED_RESPONSE = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"}
)


@dataclass
class PageBudget:
    """What one page has loaded so far, and what it may."""

    max_bytes: int
    used: int = 0
    requests: int = 0
    refused: int = 0


class GuardedRoute:
    """The route handler of one page's context: fetch through `client`, fulfil or abort.

    Redirects are followed here, each hop checked: Chromium follows a fulfilled 3xx itself,
    and the request it then sends is not intercepted (it would reach the network, where
    the browser can resolve no name). A navigation that redirected is answered with a
    document that moves the frame to the final URL (the frame's URL must be the one its
    relative links resolve against); that navigation gets the body fetched already.
    """

    def __init__(
        self, client: httpx.AsyncClient, budget: PageBudget, *, per_request: int, redirects: int
    ) -> None:
        self._client = client
        self._budget = budget
        self._per_request = per_request
        self._redirects = redirects
        self._ahead: dict[str, _Answer] = {}
        self.moved: dict[str, tuple[str, int]] = {}
        """Navigations that redirected: requested URL -> final URL and its status."""

    async def __call__(self, route: Route) -> None:
        """Answer one intercepted request (never raises: a failure aborts the request)."""
        request = route.request
        self._budget.requests += 1
        navigation = request.is_navigation_request()
        answer = self._ahead.pop(request.url, None) if navigation else None
        try:
            if answer is None:
                answer = await self._follow(request.url, request.method, request.headers,
                                            request.post_data_buffer)  # fmt: skip
        except (FetchError, httpx.HTTPError, httpx.InvalidURL) as exc:
            self._budget.refused += 1
            logger.debug("browser request refused", extra={"url": request.url, "exc": str(exc)})
            await _quietly_abort(route)
            return
        if navigation and answer.url != request.url:
            self._ahead[answer.url] = answer
            self.moved[request.url] = (answer.url, answer.status)
            answer = _Answer(answer.url, 200, {"content-type": "text/html"}, _moved_to(answer.url))
        try:
            await route.fulfill(status=answer.status, headers=answer.headers, body=answer.body)
        except Exception as exc:  # noqa: BLE001 - the page went away meanwhile
            logger.debug("browser request not fulfilled", extra={"exc": str(exc)})

    async def _follow(
        self, url: str, method: str, headers: dict[str, str], content: bytes | None
    ) -> _Answer:
        """The answer at the end of `url`'s redirects, every hop through the guard."""
        sent = {k: v for k, v in headers.items() if k.lower() not in _DROPPED_REQUEST}
        sent["Accept-Encoding"] = "gzip, deflate"  # only what BodyDecoder inflates
        current = url
        for _ in range(self._redirects + 1):
            target = checked_url(current)  # BlockedURL: not http(s), credentials, malformed
            request = self._client.build_request(method, target, headers=sent, content=content)
            response = await self._client.send(request, stream=True)
            try:
                location = redirect_location(response)
                if location is None:
                    return await self._read(current, response)
            finally:
                await response.aclose()
            current = str(target.join(location))
            if response.status_code in (301, 302, 303) and method != "HEAD":
                method, content = "GET", None  # as browsers do
        raise FetchError(url, f"more than {self._redirects} redirects")

    async def _read(self, url: str, response: httpx.Response) -> _Answer:
        room = min(self._per_request, self._budget.max_bytes - self._budget.used)
        decoder = BodyDecoder(url, response.headers.get("content-encoding", ""), max(room, 0))
        async for raw in response.aiter_raw():
            decoder.feed(raw)  # ContentTooLarge past the page's remaining budget
        body = decoder.finish()
        self._budget.used += len(body)
        kept = {k: v for k, v in response.headers.items() if k.lower() not in _DROPPED_RESPONSE}
        return _Answer(url, response.status_code, kept, body)


@dataclass(frozen=True)
class _Answer:
    url: str
    status: int
    headers: dict[str, str]
    body: bytes


def _moved_to(url: str) -> bytes:
    """A document that replaces itself with `url` (no script needed)."""
    target = html.escape(url, quote=True)
    return f'<!doctype html><meta http-equiv="refresh" content="0; url={target}">'.encode()


async def _quietly_abort(route: Route) -> None:
    try:
        await route.abort("blockedbyclient")
    except Exception as exc:  # noqa: BLE001 - the page went away meanwhile
        logger.debug("browser request not aborted", extra={"exc": str(exc)})
