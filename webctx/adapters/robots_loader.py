"""robots.txt for the fetcher: GET /robots.txt through the fetcher's guarded client, one
request per origin at a time, its answer turned into rules and cached.

Concurrent fetches of one origin's pages share the request under way (a cold job used to
send one per page it started before the first answer came back). The request runs as its
own task under its own deadline: a waiter whose deadline passes stops waiting, the
request goes on for the others.

RFC 9309 2.3.1: redirects are followed (up to the fetcher's `max_redirects`, 5 by
default; past them, no rules); 2xx is parsed (its first 500 KiB), 4xx allows everything,
5xx, 429 and no answer at all (refused connection, timeout) disallow everything for a
while (`webctx.net.politeness.UNREACHABLE_TTL_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx

from webctx.adapters.guarded_transport import NoSlot, checked_url, redirect_location
from webctx.adapters.http_body import BodyDecoder
from webctx.errors import BlockedURL, FetchError
from webctx.net.politeness import (
    ROBOTS_MAX_BYTES,
    Politeness,
    RobotsRules,
    robots_rules,
    unreachable_rules,
)
from webctx.settings import FetchSettings

HostSlot = Callable[[str, str, float], contextlib.AbstractAsyncContextManager[None]]


class RobotsLoader:
    """An origin's robots.txt rules, fetched once however many fetches ask at once.

    Lives on the fetcher's event loop (not thread-safe); a new loop needs a new loader."""

    def __init__(self, settings: FetchSettings, host_slot: HostSlot) -> None:
        self._settings = settings
        self._host_slot = host_slot  # the fetcher's per-host connection slots
        self._pending: dict[str, asyncio.Task[RobotsRules]] = {}

    async def rules(
        self, polite: Politeness, client: httpx.AsyncClient, origin: str
    ) -> RobotsRules:
        """The rules of `origin` (scheme://host:port), joining a request under way."""
        pending = self._pending.get(origin)
        if pending is None:
            pending = asyncio.ensure_future(self._load(polite, client, origin))
            self._pending[origin] = pending
            pending.add_done_callback(lambda done: self._forget(origin, done))
        return await asyncio.shield(pending)

    def _forget(self, origin: str, done: asyncio.Task[RobotsRules]) -> None:
        if self._pending.get(origin) is done:
            del self._pending[origin]
        if not done.cancelled():
            done.exception()  # retrieved: no warning when every waiter had given up

    async def _load(
        self, polite: Politeness, client: httpx.AsyncClient, origin: str
    ) -> RobotsRules:
        """GET /robots.txt under its own deadline, then cache the rules. A refusal by the
        address guard, or no free slot to the host, is raised (and not cached): the site
        itself said nothing."""
        total = self._settings.total_timeout_s
        try:
            async with asyncio.timeout(total):
                rules = await self._fetch(polite, client, origin, time.monotonic() + total)
        except (BlockedURL, NoSlot):
            raise
        except (TimeoutError, FetchError, httpx.HTTPError):
            rules = unreachable_rules(polite.user_agent)
        polite.robots.put(origin, rules)
        return rules

    async def _fetch(
        self, polite: Politeness, client: httpx.AsyncClient, origin: str, deadline: float
    ) -> RobotsRules:
        url = f"{origin}/robots.txt"
        for _ in range(self._settings.max_redirects + 1):
            target = checked_url(url)
            async with self._host_slot(url, target.host, deadline):
                response = await client.send(client.build_request("GET", target), stream=True)
                try:
                    location = redirect_location(response)
                    status, body = response.status_code, b""
                    if location is None and 200 <= status < 300:
                        body = await _read_head(url, response)
                finally:
                    await response.aclose()
            if location is None:
                return robots_rules(status, body, user_agent=polite.user_agent)
            url = str(target.join(location))
        return robots_rules(404, b"", user_agent=polite.user_agent)  # RFC 9309: > 5 hops


async def _read_head(url: str, response: httpx.Response) -> bytes:
    """The decoded body up to one byte past the parse limit (so the parser knows it was
    cut); the rest is never read."""
    encoding = response.headers.get("content-encoding", "")
    decoder = BodyDecoder(url, encoding, ROBOTS_MAX_BYTES + 1, truncate=True)
    async for raw in response.aiter_raw():
        decoder.feed(raw)
        if decoder.truncated:
            break
    return decoder.finish()
