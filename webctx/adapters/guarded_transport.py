"""The fetcher's transport: an httpcore network backend that connects only to addresses the
policy checked (resolved once, no second lookup), and an httpx transport over it that
raises webctx errors. See `webctx.adapters.httpx_fetcher` for how they are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpcore
import httpx

from webctx.errors import BlockedURL, FetchError, FetchTimeout, HTTPStatusError
from webctx.net.addresses import (
    AddressPolicy,
    IPAddress,
    Resolver,
    check_url,
    parse_ip_host,
    resolve_checked,
)
from webctx.net.portpolicy import check_port


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves and checks the host (address, then port), then connects to a checked address."""

    def __init__(
        self,
        policy: AddressPolicy,
        resolver: Resolver,
        dns: ThreadPoolExecutor,
        allowed_ports: frozenset[int],
    ):
        self._policy = policy
        self._resolver = resolver
        self._dns = dns
        self._allowed_ports = allowed_ports
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self.addresses(host, port, timeout)
        error: httpcore.ConnectError | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:  # try the next checked address
                error = exc
        raise error or httpcore.ConnectError(f"no address for {host}")

    async def addresses(self, host: str, port: int, timeout: float | None) -> list[IPAddress]:
        """The host's addresses, each checked by the policy, the port checked for them."""
        addresses = await self._resolve(host, port, timeout)
        check_port(host, port, addresses, policy=self._policy, allowed_ports=self._allowed_ports)
        return addresses

    async def _resolve(self, host: str, port: int, timeout: float | None) -> list[IPAddress]:
        lookup = functools.partial(
            resolve_checked, host, port, policy=self._policy, resolver=self._resolver
        )
        if parse_ip_host(host) is not None:
            return lookup()  # a literal: no lookup, no thread
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.get_running_loop().run_in_executor(self._dns, lookup)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host} took over {timeout}s") from exc

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over our httpcore pool that raises webctx errors."""

    def __init__(self, pool: httpcore.AsyncConnectionPool) -> None:
        self._pool = pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with translated(url):
            core = await self._pool.handle_async_request(core_request)
        return httpx.Response(
            core.status,
            headers=core.headers,
            stream=_ResponseStream(url, core),
            extensions=core.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, url: str, core: httpcore.Response) -> None:
        self._url, self._core = url, core

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with translated(self._url):
            async for part in self._core.aiter_stream():
                yield part

    async def aclose(self) -> None:
        await self._core.aclose()


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Turn httpcore and address-guard errors into webctx errors about `url`."""
    try:
        yield
    except httpcore.TimeoutException as exc:
        raise FetchTimeout(url, f"{type(exc).__name__}: {exc}") from exc
    except FetchError as exc:
        if exc.url == url:
            raise
        raise for_url(exc, url) from exc
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
        raise FetchError(url, f"{type(exc).__name__}: {exc}") from exc


def guarded_client(
    backend: GuardedBackend,
    *,
    ssl_context: ssl.SSLContext,
    connections: int,
    keepalive_s: float,
    timeout: httpx.Timeout,
    headers: dict[str, str],
) -> httpx.AsyncClient:
    """An httpx client whose every connection goes through `backend` (checked addresses);
    it follows no redirect (each hop must pass `checked_url` first) and ignores env proxies
    (a proxy would connect for us, past the guard)."""
    pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context, network_backend=backend, max_connections=connections,
        max_keepalive_connections=connections, keepalive_expiry=keepalive_s,
    )  # fmt: skip
    return httpx.AsyncClient(transport=GuardedTransport(pool), timeout=timeout, headers=headers,
                             follow_redirects=False, trust_env=False)  # fmt: skip


def for_url(exc: FetchError, url: str) -> FetchError:
    """The same failure reported against `url` (the guard knows hosts, callers know URLs)."""
    message = f"{exc} (at {exc.url})" if "://" in exc.url else str(exc)
    if isinstance(exc, HTTPStatusError):
        return HTTPStatusError(url, message, status=exc.status)
    return type(exc)(url, message)


REDIRECTS = frozenset({301, 302, 303, 307, 308})


class NoSlot(FetchTimeout):
    """Every connection slot to the host stayed busy until the deadline (nothing was sent)."""


def checked_url(url: str) -> httpx.URL:
    """`url` parsed by httpx after `check_url`; BlockedURL if either refuses it."""
    check_url(url)
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BlockedURL(url, f"malformed URL: {exc}") from exc
    # Re-check with httpx's own parse: it is the one that decides where we connect.
    if target.scheme not in ("http", "https") or target.userinfo or not target.host:
        raise BlockedURL(url, "URL refused after parsing")
    return target


def redirect_location(response: httpx.Response) -> str | None:
    """The Location of a redirect response, else None."""
    if response.status_code in REDIRECTS:
        return response.headers.get("location") or None
    return None
