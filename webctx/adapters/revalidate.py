"""Conditional GETs on kept-alive HTTP/1.1 connections, on asyncio streams with h11.

A re-index run mostly learns that a page has not changed: one 304 per URL. Through httpx
each costs ~0.9 ms of CPU on the loop thread (client, pool bookkeeping, anyio), straight
on h11 ~0.1 ms (1,000 conditional GETs to one loopback host, 8 at a time, side by side),
and a 1,000-page re-index is mostly these requests (bench/reindex.py).

A 304 (the page is unchanged), an error status (404, 410, 429...) and a changed page's 2xx
body are read here: the body as sent, at most `max_body` bytes, of an accepted type; the
caller decodes and checks it with the full path's own code (size cap after inflating,
binary sniffing). A redirect, a larger or other-typed body, or anything unexpected (a
protocol error, a reset, EOF) returns None, and the caller fetches the URL through the
full httpx path, which follows, reads and caps it.

The guard is the same as that path's: the host is resolved once, every address and the
port are checked (`GuardedBackend.addresses`), the connection goes to a checked
address and stays bound to it; an idle connection is dropped after `KEEPALIVE_S`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import h11
import httpx

from webctx.adapters.guarded_transport import REDIRECTS, GuardedBackend
from webctx.adapters.http_body import declared_length, parse_content_type
from webctx.errors import FetchError, FetchTimeout
from webctx.net.optouts import KEPT_HEADERS

DRAIN_BYTES = 64 * 1024
"""An error response declaring at most this much is read to its end, so its connection
can be reused (a 404 page during a re-index); a longer or unsized one closes it."""
_READ = 64 * 1024


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    protocol: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0

    def close(self) -> None:
        self.writer.close()

    def usable(self, now: float, keepalive_s: float) -> bool:
        """Idle for less than the keep-alive period, and not closed by either side."""
        return (now - self.idle_since < keepalive_s and not self.reader.at_eof()
                and not self.writer.is_closing())  # fmt: skip


@dataclass(frozen=True)
class Answer:
    """A response of the lean path: status, headers (lower-case names; a repeated opt-out
    header's values joined by newlines, which no value holds) and, for a 2xx, the body as sent (the
    caller decodes it and checks it like the full path)."""

    status: int
    headers: dict[str, str]
    body: bytes = b""


class Revalidator:
    """Sends conditional GETs for one fetcher; use only on the fetcher's event loop."""

    def __init__(
        self,
        backend: GuardedBackend,
        *,
        ssl_context: ssl.SSLContext,
        user_agent: str,
        accept: str,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float,
        max_idle_per_origin: int,
    ) -> None:
        self._backend = backend
        self._ssl = ssl_context
        self._headers = [(b"User-Agent", user_agent.encode()), (b"Accept", accept.encode())]
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._keepalive = keepalive_s
        self._max_idle = max(1, max_idle_per_origin)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._swept = time.monotonic()

    async def ask(
        self,
        target: httpx.URL,
        conditional: dict[str, str],
        *,
        types: frozenset[str],
        max_body: int,
    ) -> Answer | None:
        """Send the request and read the answer: a 304, an error status, or a 2xx whose body
        is of one of `types` (or untyped) and at most `max_body` bytes as sent. None for a
        redirect, any other 2xx, or a connection that failed before an answer: the full
        path then fetches the URL and reports what it finds."""
        origin = (target.scheme, target.host, target.port or _default_port(target.scheme))
        request = h11.Request(
            method="GET",
            target=target.raw_path,
            headers=[
                (b"Host", target.netloc),
                *self._headers,
                *((k.encode(), v.encode("latin-1")) for k, v in conditional.items()),
            ],
        )
        self._sweep()
        reused = self._take_idle(origin)
        if reused is not None:
            try:
                return await self._exchange(origin, reused, request, types, max_body)
            except (ConnectionError, h11.RemoteProtocolError, _ClosedEarly):
                reused.close()  # the server closed it while idle: once more on a new one
        connection = await self._open(origin)
        try:
            return await self._exchange(origin, connection, request, types, max_body)
        except (ConnectionError, h11.RemoteProtocolError, _ClosedEarly):
            connection.close()
            return None

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()

    async def _open(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        addresses = await self._backend.addresses(host, port, self._connect_timeout)
        timed_out, error = False, None
        for address in addresses:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    reader, writer = await asyncio.open_connection(
                        str(address), port, ssl=self._ssl if scheme == "https" else None,
                        server_hostname=host if scheme == "https" else None,
                    )  # fmt: skip
                return _Connection(reader, writer)
            except TimeoutError:
                timed_out = True
            except OSError as exc:  # refused, unreachable: try the next checked address
                error = exc
        if error is None and timed_out:
            raise FetchTimeout(host, f"connecting took over {self._connect_timeout}s")
        raise FetchError(host, f"cannot connect: {error}")  # reported, not tried again

    async def _exchange(
        self,
        origin: tuple[str, str, int],
        connection: _Connection,
        request: h11.Request,
        types: frozenset[str],
        max_body: int,
    ) -> Answer | None:
        conn = connection.protocol
        connection.writer.write(conn.send(request) + conn.send(h11.EndOfMessage()))
        await connection.writer.drain()
        response = await self._next(connection, started=True)
        if not isinstance(response, h11.Response):
            raise _ClosedEarly()
        status = response.status_code
        headers: dict[str, str] = {}
        for key, value in response.headers:
            name, text = key.decode("latin-1").lower(), value.decode("latin-1")
            joined = name in headers and name in KEPT_HEADERS  # others: the last one
            headers[name] = f"{headers[name]}\n{text}" if joined else text
        if 200 <= status < 300:
            if not _readable(headers, types, max_body):
                connection.close()
                return None
            body = bytearray()
            while not isinstance(event := await self._next(connection), h11.EndOfMessage):
                if isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > max_body:
                        connection.close()
                        return None
            self._keep(origin, connection)
            return Answer(status, headers, bytes(body))
        if status in REDIRECTS:
            connection.close()
            return None  # each hop goes through the full path's checks
        if status == 304 or drainable(headers):
            while not isinstance(await self._next(connection), h11.EndOfMessage):
                pass  # no body (304) or a short error page: read it, keep the connection
            self._keep(origin, connection)
        else:
            connection.close()
        return Answer(status, headers)

    async def _next(self, connection: _Connection, *, started: bool = False) -> object:
        conn = connection.protocol
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    async with asyncio.timeout(self._read_timeout):
                        data = await connection.reader.read(_READ)
                except TimeoutError as exc:
                    connection.close()
                    raise FetchTimeout("", f"no response within {self._read_timeout}s") from exc
                if not data and started and conn.their_state is h11.SEND_RESPONSE:
                    raise _ClosedEarly()  # EOF before any byte of a response
                conn.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            return event

    def _sweep(self) -> None:
        """Close every origin's expired idle connections (at most once per keep-alive
        period), so a run over many hosts does not keep their sockets open."""
        now = time.monotonic()
        if now - self._swept < self._keepalive:
            return
        self._swept = now
        for origin, connections in list(self._idle.items()):
            for connection in connections:
                if not connection.usable(now, self._keepalive):
                    connection.close()
            kept = [c for c in connections if not c.writer.is_closing()]
            if kept:
                self._idle[origin] = kept
            else:
                del self._idle[origin]

    def _take_idle(self, origin: tuple[str, str, int]) -> _Connection | None:
        connections = self._idle.get(origin)
        now = time.monotonic()
        while connections:
            connection = connections.pop()
            if connection.usable(now, self._keepalive):
                return connection
            connection.close()
        return None

    def _keep(self, origin: tuple[str, str, int], connection: _Connection) -> None:
        conn = connection.protocol
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            connection.close()  # "Connection: close", or a message not read to its end
            return
        conn.start_next_cycle()
        connection.idle_since = time.monotonic()
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= self._max_idle:
            connection.close()
        else:
            idle.append(connection)


class _ClosedEarly(Exception):
    """The server closed the connection before answering (a kept-alive one it dropped)."""


def _readable(headers: dict[str, str], types: frozenset[str], max_body: int) -> bool:
    media, _ = parse_content_type(headers.get("content-type", ""))
    length = declared_length(headers)
    return (not media or media in types) and (length is None or length <= max_body)


def drainable(headers: Mapping[str, str]) -> bool:
    """Whether an error response is short enough to read to its end, keeping its
    connection (its declared length at most DRAIN_BYTES)."""
    length = declared_length(headers)
    return length is not None and length <= DRAIN_BYTES


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80
