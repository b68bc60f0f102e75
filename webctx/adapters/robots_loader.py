"""robots.txt and tdmrep.json for the fetcher: GET /robots.txt and
/.well-known/tdmrep.json through the fetcher's guarded client, one request per origin
and file at a time, each answer turned into rules and cached.

Concurrent fetches of one origin's pages share the request under way (a cold job used to
send one per page it started before the first answer came back). The request runs as its
own task under its own deadline: a waiter whose deadline passes stops waiting, the
request goes on for the others.

robots.txt, RFC 9309 2.3.1: redirects are followed (up to the fetcher's `max_redirects`,
5 by default; past them, no rules); 2xx is parsed (its first 500 KiB), 4xx allows
everything, 5xx, 429 and no answer at all (refused connection, timeout) disallow
everything for a while (`webctx.net.politeness.UNREACHABLE_TTL_S`).

tdmrep.json (W3C TDMRep): a 2xx JSON array is read (`webctx.net.optouts`); any other
answer, or none, reserves nothing (an unreachable file is asked again after a while).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import httpx

from webctx.adapters.guarded_transport import NoSlot, checked_url, redirect_location
from webctx.adapters.http_body import BodyDecoder
from webctx.errors import BlockedURL, FetchError
from webctx.net.optouts import TDMREP_MAX_BYTES, TDMREP_PATH, TdmRep, tdmrep_rules
from webctx.net.politeness import (
    ROBOTS_MAX_BYTES,
    OriginCache,
    Politeness,
    RobotsRules,
    robots_rules,
    unreachable_rules,
)
from webctx.settings import FetchSettings

T = TypeVar("T")
HostSlot = Callable[[str, str, float], contextlib.AbstractAsyncContextManager[None]]


class OriginFileLoader(Generic[T]):
    """A file of an origin (`path`), fetched once however many fetches ask at once.

    Lives on the fetcher's event loop (not thread-safe); a new loop needs a new loader."""

    path = ""
    max_bytes = ROBOTS_MAX_BYTES

    def __init__(self, settings: FetchSettings, host_slot: HostSlot) -> None:
        self._settings = settings
        self._host_slot = host_slot  # the fetcher's per-host connection slots
        self._pending: dict[str, asyncio.Task[T]] = {}

    def cache(self, polite: Politeness) -> OriginCache[T]:
        """Where the answers are kept."""
        raise NotImplementedError

    def parse(self, polite: Politeness, status: int, body: bytes) -> T:
        """The rules of an answer (status after redirects)."""
        raise NotImplementedError

    def unreachable(self, polite: Politeness) -> T:
        """The rules when no answer came (no connection, a timeout)."""
        raise NotImplementedError

    async def rules(self, polite: Politeness, client: httpx.AsyncClient, origin: str) -> T:
        """The rules of `origin` (scheme://host:port), joining a request under way."""
        pending = self._pending.get(origin)
        if pending is None:
            pending = asyncio.ensure_future(self._load(polite, client, origin))
            self._pending[origin] = pending
            pending.add_done_callback(lambda done: self._forget(origin, done))
        return await asyncio.shield(pending)

    def _forget(self, origin: str, done: asyncio.Task[T]) -> None:
        if self._pending.get(origin) is done:
            del self._pending[origin]
        if not done.cancelled():
            done.exception()  # retrieved: no warning when every waiter had given up

    async def _load(self, polite: Politeness, client: httpx.AsyncClient, origin: str) -> T:
        """GET the file under its own deadline, then cache the rules. A refusal by the
        address guard, or no free slot to the host, is raised (and not cached): the site
        itself said nothing."""
        total = self._settings.total_timeout_s
        try:
            async with asyncio.timeout(total):
                rules = await self._fetch(polite, client, origin, time.monotonic() + total)
        except (BlockedURL, NoSlot):
            raise
        except (TimeoutError, FetchError, httpx.HTTPError):
            rules = self.unreachable(polite)
            self.cache(polite).put(origin, rules, brief=True)
            return rules
        self.cache(polite).put(origin, rules)
        return rules

    async def _fetch(
        self, polite: Politeness, client: httpx.AsyncClient, origin: str, deadline: float
    ) -> T:
        url = f"{origin}{self.path}"
        for _ in range(self._settings.max_redirects + 1):
            target = checked_url(url)
            async with self._host_slot(url, target.host, deadline):
                response = await client.send(client.build_request("GET", target), stream=True)
                try:
                    location = redirect_location(response)
                    status, body = response.status_code, b""
                    if location is None and 200 <= status < 300:
                        body = await _read_head(url, response, self.max_bytes)
                finally:
                    await response.aclose()
            if location is None:
                return self.parse(polite, status, body)
            url = str(target.join(location))
        return self.parse(polite, 404, b"")  # RFC 9309: past the redirects, no rules


class RobotsLoader(OriginFileLoader[RobotsRules]):
    """An origin's robots.txt rules, matched for the politeness's product token."""

    path = "/robots.txt"

    def cache(self, polite: Politeness) -> OriginCache[RobotsRules]:
        """The politeness's robots.txt cache."""
        return polite.robots

    def parse(self, polite: Politeness, status: int, body: bytes) -> RobotsRules:
        """RFC 9309's reading of the status and body."""
        return robots_rules(status, body, user_agent=polite.agent)

    def unreachable(self, polite: Politeness) -> RobotsRules:
        """Disallow all, for a while."""
        return unreachable_rules(polite.agent)


class TdmRepLoader(OriginFileLoader[TdmRep]):
    """An origin's /.well-known/tdmrep.json rules."""

    path = TDMREP_PATH
    max_bytes = TDMREP_MAX_BYTES

    def cache(self, polite: Politeness) -> OriginCache[TdmRep]:
        """The politeness's tdmrep.json cache."""
        return polite.tdmrep

    def parse(self, polite: Politeness, status: int, body: bytes) -> TdmRep:  # noqa: ARG002
        """The file's rules (none unless a 2xx JSON array)."""
        return tdmrep_rules(status, body)

    def unreachable(self, polite: Politeness) -> TdmRep:  # noqa: ARG002
        """No file read: nothing reserved by it (headers and meta tags still count)."""
        return TdmRep()


async def _read_head(url: str, response: httpx.Response, limit: int) -> bytes:
    """The decoded body up to one byte past `limit` (so the parser knows it was cut); the
    rest is never read."""
    encoding = response.headers.get("content-encoding", "")
    decoder = BodyDecoder(url, encoding, limit + 1, truncate=True)
    async for raw in response.aiter_raw():
        decoder.feed(raw)
        if decoder.truncated:
            break
    return decoder.finish()
