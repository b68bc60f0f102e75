"""The page fetcher: httpx under a hard deadline, a decoded-size cap and the address guard.

Design (see TRAPS 6-8):
- Deadline: each `fetch` runs a private event loop (`asyncio.run`) and wraps every hop,
  the DNS lookup (in a thread) and the body read in one `asyncio.timeout`. httpx's own
  timeouts are per operation, so a trickling server only trips this one.
- Connect-to-checked-IP: a custom httpcore network backend resolves the host, checks every
  address with the policy and connects to a checked address; httpcore still sends the name
  as Host and SNI. There is no second lookup, hence no DNS rebinding window.
- Size: the body is read raw and inflated here with a zlib output limit, so a gzip bomb
  never inflates past `max_bytes` (httpx's decoders have no output limit).
- Politeness (optional, `webctx.politeness`): every hop consults robots.txt (fetched through
  this same guarded client), waits its turn for the host, and a 429/503 pauses the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpcore
import httpx

from webctx.adapters.http_body import (
    BodyDecoder,
    looks_binary,
    parse_content_type,
    sniff_text_type,
)
from webctx.errors import (
    BlockedURL,
    ContentTooLarge,
    FetchError,
    FetchTimeout,
    HTTPStatusError,
    UnsupportedContent,
)
from webctx.models import Download
from webctx.netguard import (
    AddressPolicy,
    IPAddress,
    Resolver,
    check_url,
    parse_ip_host,
    resolve_checked,
    system_resolver,
)
from webctx.politeness import (
    ROBOTS_MAX_BYTES,
    Politeness,
    RobotsRules,
    parse_retry_after,
    robots_rules,
)
from webctx.portpolicy import check_port
from webctx.settings import FetchSettings

logger = logging.getLogger(__name__)

ACCEPTED_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/plain"})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_HEADERS = {"Accept": "text/html,application/xhtml+xml;q=0.9,text/plain;q=0.8",
            "Accept-Encoding": "gzip, deflate"}  # fmt: skip # only what BodyDecoder inflates


class HttpxFetcher:
    """Fetches pages with httpx under `FetchSettings` and an `AddressPolicy`; thread-safe.

    Call `fetch` from worker threads (it runs its own event loop), not from async code.
    """

    def __init__(
        self,
        settings: FetchSettings,
        *,
        policy: AddressPolicy,
        resolver: Resolver = system_resolver,
        politeness: Politeness | None = None,
    ) -> None:
        self._settings = settings
        self._politeness = politeness
        self._policy = policy
        self._resolver = resolver
        self._ssl_context = httpx.create_ssl_context()  # built once: loading CAs is slow
        # DNS runs here, not in the loop's default executor, so a hung lookup is abandoned
        # at the deadline instead of being joined by asyncio.run.
        self._dns = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="webctx-dns")
        self._slots_lock = threading.Lock()
        # Weak values: a host's semaphore lives while some fetch holds or waits on it.
        self._slots = weakref.WeakValueDictionary[str, threading.BoundedSemaphore]()
        # This thread's fetch: conditional headers (page hops only) and accepted media types.
        self._call = threading.local()

    def fetch(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        media_types: frozenset[str] | None = None,
    ) -> Download:
        """The body of `url` after redirects. Raises FetchError subclasses.

        With `etag`/`last_modified` (from an earlier fetch) the request is conditional: a
        304 comes back as a Download with status 304 and an empty body. `media_types`
        replaces the accepted content types (the index reads sitemaps and feeds)."""
        check_url(url)
        headers: dict[str, str] = {}
        if etag:
            headers["If-None-Match"] = etag
        if last_modified:
            headers["If-Modified-Since"] = last_modified
        return asyncio.run(self._fetch(url, headers, media_types or ACCEPTED_TYPES))

    def close(self) -> None:
        """Release the DNS threads (a lookup still running is abandoned)."""
        self._dns.shutdown(wait=False, cancel_futures=True)

    async def _fetch(
        self, url: str, headers: dict[str, str], types: frozenset[str] = ACCEPTED_TYPES
    ) -> Download:
        total = self._settings.total_timeout_s
        started = time.monotonic()
        async with self._new_client() as client:
            self._call.headers, self._call.types = headers, types
            try:
                async with asyncio.timeout(total):
                    download = await self._follow(client, url, started + total)
            except TimeoutError as exc:
                raise FetchTimeout(url, f"no complete response within {total}s") from exc
        ms = round((time.monotonic() - started) * 1000)
        extra = {"url": url, "final_url": download.final_url, "status": download.status}
        logger.debug("page fetched", extra=extra | {"bytes": len(download.body), "ms": ms})
        return download

    def _new_client(self) -> httpx.AsyncClient:
        ports = frozenset(self._settings.allowed_ports)
        backend = _GuardedBackend(self._policy, self._resolver, self._dns, ports)
        pool = httpcore.AsyncConnectionPool(ssl_context=self._ssl_context, network_backend=backend)
        s = self._settings
        return httpx.AsyncClient(
            transport=_GuardedTransport(pool),
            timeout=httpx.Timeout(s.read_timeout_s, connect=s.connect_timeout_s),
            headers={"User-Agent": s.user_agent, **_HEADERS},
            follow_redirects=False,  # each hop must pass check_url and the address guard
            trust_env=False,  # an env proxy would connect for us, past the guard
        )

    async def _follow(self, client: httpx.AsyncClient, url: str, deadline: float) -> Download:
        current = url
        try:
            for _ in range(self._settings.max_redirects + 1):
                result = await self._hop(client, url, current, deadline)
                if isinstance(result, Download):
                    return result
                current = result
        except FetchError as exc:
            if exc.url == url:
                raise
            raise _for_url(exc, url) from exc
        except httpx.HTTPError as exc:  # anything the transport did not translate
            raise FetchError(url, f"{type(exc).__name__}: {exc}") from exc
        raise FetchError(url, f"more than {self._settings.max_redirects} redirects")

    async def _hop(
        self, client: httpx.AsyncClient, url: str, current: str, deadline: float
    ) -> Download | str:
        """One request: the download, or the URL a redirect points to."""
        target = _checked_url(current)
        if self._politeness is not None:
            await self._be_polite(self._politeness, client, target, deadline)
        with self._host_slot(current, target.host, deadline):
            conditional = getattr(self._call, "headers", None)
            request = client.build_request("GET", target, headers=conditional)
            response = await client.send(request, stream=True)
            try:
                location = _redirect_location(response)
                if location is None:
                    return await self._download(url, response)
            finally:
                await response.aclose()
        try:
            return str(target.join(location))
        except httpx.InvalidURL as exc:
            raise BlockedURL(current, f"bad redirect Location {location!r}: {exc}") from exc

    async def _be_polite(
        self, polite: Politeness, client: httpx.AsyncClient, target: httpx.URL, deadline: float
    ) -> None:
        """robots.txt, then the host's turn; BlockedURL or FetchTimeout instead of waiting."""
        origin = f"{target.scheme}://{target.netloc.decode('ascii')}"
        rules = polite.robots.get(origin) if polite.respect_robots else None
        if rules is None and polite.respect_robots:
            rules = await self._robots(polite, client, origin, deadline)
            polite.robots.put(origin, rules)
        if rules is not None and not rules.allows(str(target)):
            raise BlockedURL(str(target), "disallowed by robots.txt")
        delay = rules.crawl_delay if rules is not None else None
        wait = polite.pacer.reserve(target.host, delay_s=delay, latest=deadline)
        if wait is None:
            raise FetchTimeout(str(target), f"{target.host} is paced or paused past the deadline")
        await asyncio.sleep(wait)

    async def _robots(
        self, polite: Politeness, client: httpx.AsyncClient, origin: str, deadline: float
    ) -> RobotsRules:
        url = f"{origin}/robots.txt"
        for _ in range(self._settings.max_redirects + 1):
            target = _checked_url(url)
            with self._host_slot(url, target.host, deadline):
                response = await client.send(client.build_request("GET", target), stream=True)
                try:
                    location = _redirect_location(response)
                    status, body = response.status_code, b""
                    if location is None and 200 <= status < 300:
                        encoding = response.headers.get("content-encoding", "")
                        decoder = BodyDecoder(url, encoding, ROBOTS_MAX_BYTES)
                        async for raw in response.aiter_raw():
                            decoder.feed(raw)
                        body = decoder.finish()
                finally:
                    await response.aclose()
            if location is None:
                return robots_rules(status, body, user_agent=polite.user_agent)
            url = str(target.join(location))
        return robots_rules(404, b"", user_agent=polite.user_agent)  # RFC 9309: > 5 hops

    @contextlib.contextmanager
    def _host_slot(self, url: str, host: str, deadline: float) -> Iterator[None]:
        with self._slots_lock:
            slot = self._slots.get(host)
            if slot is None:
                slot = threading.BoundedSemaphore(self._settings.per_host_concurrency)
                self._slots[host] = slot
        # Blocking is fine here: the event loop is private to this fetch, and the wait is
        # bounded by what is left of the deadline.
        if not slot.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise FetchTimeout(url, f"no free connection slot for {host} before the deadline")
        try:
            yield
        finally:
            slot.release()

    async def _download(self, url: str, response: httpx.Response) -> Download:
        final_url = str(response.url)
        self._note_status(response)
        if response.status_code == 304 and getattr(self._call, "headers", None):
            return Download(url=url, final_url=final_url, status=304, content_type="", body=b"",
                            etag=response.headers.get("etag"),
                            last_modified=response.headers.get("last-modified"))  # fmt: skip
        if not 200 <= response.status_code < 300:
            raise HTTPStatusError(
                final_url, f"HTTP {response.status_code}", status=response.status_code
            )
        media, charset = parse_content_type(response.headers.get("content-type", ""))
        if media and media not in getattr(self._call, "types", ACCEPTED_TYPES):
            raise UnsupportedContent(final_url, f"content type {media!r}")
        limit = self._settings.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            # Compressed or not, a body this long on the wire decodes to more than the cap.
            raise ContentTooLarge(final_url, f"Content-Length {declared} > {limit}")
        decoder = BodyDecoder(final_url, response.headers.get("content-encoding", ""), limit)
        async for raw in response.aiter_raw():
            decoder.feed(raw)
        body = decoder.finish()
        if looks_binary(body[:1024]):
            raise UnsupportedContent(final_url, f"binary body served as {media or 'untyped'}")
        return Download(
            url=url,
            final_url=final_url,
            status=response.status_code,
            content_type=media or sniff_text_type(body),
            body=body,
            encoding=charset,
            etag=response.headers.get("etag"),
            last_modified=response.headers.get("last-modified"),
        )

    def _note_status(self, response: httpx.Response) -> None:
        """Tell the pacer how the host is doing: 429/503 pause it, anything else does not."""
        if self._politeness is None:
            return
        pacer, host = self._politeness.pacer, response.url.host
        if response.status_code in (429, 503):
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            pause = pacer.busy(host, retry_after)
            logger.info("host paused", extra={"host": host, "status": response.status_code,
                                              "pause_s": pause})  # fmt: skip
        else:
            pacer.ok(host)


class _GuardedBackend(httpcore.AsyncNetworkBackend):
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
        addresses = await self._resolve(host, port, timeout)
        check_port(host, port, addresses, policy=self._policy, allowed_ports=self._allowed_ports)
        error: httpcore.ConnectError | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:  # try the next checked address
                error = exc
        raise error or httpcore.ConnectError(f"no address for {host}")

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


class _GuardedTransport(httpx.AsyncBaseTransport):
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
        with _translated(url):
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
        with _translated(self._url):
            async for part in self._core.aiter_stream():
                yield part

    async def aclose(self) -> None:
        await self._core.aclose()


@contextlib.contextmanager
def _translated(url: str) -> Iterator[None]:
    """Turn httpcore and netguard errors into webctx errors about `url`."""
    try:
        yield
    except httpcore.TimeoutException as exc:
        raise FetchTimeout(url, f"{type(exc).__name__}: {exc}") from exc
    except FetchError as exc:
        if exc.url == url:
            raise
        raise _for_url(exc, url) from exc
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
        raise FetchError(url, f"{type(exc).__name__}: {exc}") from exc


def _for_url(exc: FetchError, url: str) -> FetchError:
    """The same failure reported against `url` (netguard knows hosts, callers know URLs)."""
    message = f"{exc} (at {exc.url})" if "://" in exc.url else str(exc)
    if isinstance(exc, HTTPStatusError):
        return HTTPStatusError(url, message, status=exc.status)
    return type(exc)(url, message)


def _checked_url(url: str) -> httpx.URL:
    check_url(url)
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BlockedURL(url, f"malformed URL: {exc}") from exc
    # Re-check with httpx's own parse: it is the one that decides where we connect.
    if target.scheme not in ("http", "https") or target.userinfo or not target.host:
        raise BlockedURL(url, "URL refused after parsing")
    return target


def _redirect_location(response: httpx.Response) -> str | None:
    if response.status_code in _REDIRECTS:
        return response.headers.get("location") or None
    return None
