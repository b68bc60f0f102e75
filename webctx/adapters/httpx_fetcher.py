"""The page fetcher: httpx under a hard deadline, a decoded-size cap and the address guard.

Design (httpx's timeouts are per operation, decoders have no output limit, and a name
checked before connecting can resolve elsewhere when connecting):
- One event loop per fetcher, in a thread of its own, with one client whose pool keeps
  connections alive for `KEEPALIVE_S`: a re-index run's conditional GETs to one host reuse
  a few connections instead of opening one (and a loop) per request. `fetch` blocks the
  calling thread on its request's future; the loop is started lazily, again after a fork.
- Deadline: each fetch wraps every hop, the DNS lookup (in a thread) and the body read in
  one `asyncio.timeout`. httpx's own timeouts are per operation, so a trickling server
  only trips this one.
- Connect-to-checked-IP: a custom httpcore network backend resolves the host, checks every
  address with the policy and connects to a checked address; httpcore still sends the name
  as Host and SNI. There is no second lookup, hence no DNS rebinding window. A kept-alive
  connection stays bound to the address checked when it was opened, and serves only its
  own origin (scheme, host, port); an unread or failed response closes its connection.
- Size: the body is read raw and inflated here with a zlib output limit, so a gzip bomb
  never inflates past `max_bytes` (httpx's decoders have no output limit).
- Politeness (optional, `webctx.net.politeness`): every hop consults robots.txt (fetched through
  this same guarded client, one request per origin at a time: concurrent fetches await the
  pending one), waits its turn for the host, and a 429/503 pauses the host. The origin's
  tdmrep.json is read alongside robots.txt the same way; the rule reserving the final URL,
  if any, goes with the Download (`tdmrep_rule`), as do the opt-out headers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import queue
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from webctx.adapters.fetch_loop import FetchLoop
from webctx.adapters.guarded_transport import (
    GuardedBackend,
    NoSlot,
    checked_url,
    for_url,
    guarded_client,
    redirect_location,
    translated,
)
from webctx.adapters.http_body import (
    PDF,
    BodyDecoder,
    body_download,
    checked_head,
    conditional_headers,
    not_modified,
)
from webctx.adapters.revalidate import Revalidator, drainable
from webctx.adapters.robots_loader import RobotsLoader, TdmRepLoader
from webctx.errors import (
    BlockedURL,
    FetchError,
    FetchTimeout,
    HTTPStatusError,
    InvalidRedirect,
)
from webctx.models import Download
from webctx.net.addresses import AddressPolicy, Resolver, check_url, system_resolver
from webctx.net.politeness import Politeness, parse_retry_after
from webctx.protocols import Revalidation
from webctx.settings import FetchSettings

logger = logging.getLogger(__name__)

ACCEPTED_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/plain", PDF})
# The lean revalidation path reads web pages only; a PDF answer goes the full path.
_LEAN_TYPES = ACCEPTED_TYPES - {PDF}
_HEADERS = {"Accept": "text/html,application/xhtml+xml;q=0.9,text/plain;q=0.8,"
                      "application/pdf;q=0.7",
            "Accept-Encoding": "gzip, deflate"}  # fmt: skip # only what BodyDecoder inflates
KEEPALIVE_S = 2.0
"""An idle connection is closed after this; below common servers' own idle timeouts (5 s),
so a request is not sent on a connection the server is closing."""
# This fetch's conditional headers (page hops only) and accepted media types: per task.
_CALL: contextvars.ContextVar[tuple[dict[str, str], frozenset[str]]] = contextvars.ContextVar(
    "webctx_fetch_call"
)
# The tdmrep.json rule reserving the current hop's URL, if any: per task, read by _download.
_TDMREP: contextvars.ContextVar[str | None] = contextvars.ContextVar("webctx_tdmrep")
T = TypeVar("T")


class HttpxFetcher:
    """Fetches pages with httpx under `FetchSettings` and an `AddressPolicy`; thread-safe.

    Call `fetch` from worker threads (it waits on the fetcher's own event loop), not from
    a coroutine running on that loop.
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
        # Weak values: a host's semaphore lives while some fetch holds or waits on it.
        # Only touched from the loop's thread.
        self._slots = weakref.WeakValueDictionary[str, asyncio.Semaphore]()
        self._robots = RobotsLoader(settings, self._host_slot)
        self._tdmrep = TdmRepLoader(settings, self._host_slot)
        self._client: httpx.AsyncClient | None = None
        self._revalidator: Revalidator | None = None
        self._loop = FetchLoop(name="webctx-fetch-loop", on_start=self._forget_loop_state)

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
        headers = conditional_headers(etag, last_modified)
        return self._run(self._fetch(url, headers, media_types or ACCEPTED_TYPES), url)

    def fetch_many(
        self, requests: Sequence[Revalidation], *, window: int
    ) -> Iterator[tuple[int, Download | FetchError]]:
        """Revalidate many URLs on the fetcher's loop: (index, Download or FetchError) as
        each completes, at most `window` in flight or waiting to be taken. Closing the
        iterator early cancels the rest."""
        done: queue.SimpleQueue[tuple[int, Download | FetchError]] = queue.SimpleQueue()
        gate = asyncio.Semaphore(max(1, window))
        future = self._loop.submit(self._fetch_all(requests, gate, done))
        try:
            for _ in requests:
                try:
                    item = done.get(timeout=self._settings.total_timeout_s + 5.0)
                except queue.Empty:
                    raise FetchError("", "the fetch loop did not answer in time") from None
                self._loop.call_soon(gate.release)
                yield item
        finally:
            future.cancel()

    async def _fetch_all(
        self,
        requests: Sequence[Revalidation],
        gate: asyncio.Semaphore,
        done: queue.SimpleQueue[tuple[int, Download | FetchError]],
    ) -> None:
        async def one(i: int, req: Revalidation) -> None:
            conditional = conditional_headers(req.etag, req.last_modified)
            try:
                quick = await self._revalidate(req.url, conditional) if conditional else None
                done.put((i, quick or await self._fetch(req.url, conditional, ACCEPTED_TYPES)))
            except FetchError as exc:
                done.put((i, exc))
            except Exception as exc:  # never leave the consumer waiting on a lost item
                done.put((i, FetchError(req.url, f"{type(exc).__name__}: {exc}")))

        tasks = []
        try:
            for i, req in enumerate(requests):
                await gate.acquire()
                try:
                    check_url(req.url)
                except FetchError as exc:
                    done.put((i, exc))
                    continue
                tasks.append(asyncio.create_task(one(i, req)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    def warm_origins(self, urls: Sequence[str]) -> None:
        """Ask the origins of `urls` for robots.txt and tdmrep.json now, without waiting:
        the fetches of those URLs, started soon after, find the answers cached or under
        way instead of asking first (a round trip to each host before its page). A URL the
        guard refuses is left to its fetch, which says why."""
        if self._politeness is not None and urls:
            self._loop.submit(self._warm_origins(self._politeness, list(urls)))

    async def _warm_origins(self, polite: Politeness, urls: list[str]) -> None:
        if self._client is None:  # on the loop's thread: no race
            self._client = self._new_client()
        asks: list[Awaitable[object]] = []
        for url in urls:
            try:
                target = checked_url(url)
            except FetchError:
                continue
            origin = f"{target.scheme}://{target.netloc.decode('ascii')}"
            if polite.respect_robots and polite.robots.get(origin) is None:
                asks.append(self._robots.rules(polite, self._client, origin))
            if polite.tdmrep.get(origin) is None:
                asks.append(self._tdmrep.rules(polite, self._client, origin))
        await asyncio.gather(*asks, return_exceptions=True)  # a fetch reports its own

    def close(self) -> None:
        """Close kept-alive connections, stop the loop, release the DNS threads (a lookup
        still running is abandoned)."""
        self._loop.stop(self._close_client())
        self._dns.shutdown(wait=False, cancel_futures=True)

    def _run(self, work: Coroutine[Any, Any, T], url: str) -> T:
        """Run `work` on the fetcher's loop and wait for it (its own deadline applies)."""
        future = self._loop.submit(work)
        try:
            # The coroutine times itself out; this bound only guards against a stuck loop.
            return future.result(timeout=self._settings.total_timeout_s + 5.0)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise FetchTimeout(url, "the fetch loop did not answer in time") from exc

    def _forget_loop_state(self) -> None:
        """A new loop (first use, or in a forked child): what belonged to the old one goes."""
        self._client, self._revalidator = None, None
        self._slots = weakref.WeakValueDictionary()
        self._robots = RobotsLoader(self._settings, self._host_slot)
        self._tdmrep = TdmRepLoader(self._settings, self._host_slot)

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        revalidator, self._revalidator = self._revalidator, None
        if revalidator is not None:
            await revalidator.aclose()

    async def _fetch(
        self, url: str, headers: dict[str, str], types: frozenset[str] = ACCEPTED_TYPES
    ) -> Download:
        total = self._settings.total_timeout_s
        started = time.monotonic()
        if self._client is None:  # on the loop's thread: no race
            self._client = self._new_client()
        client = self._client
        _CALL.set((headers, types))
        try:
            async with asyncio.timeout(total):
                download = await self._follow(client, url, started + total)
        except TimeoutError as exc:
            raise FetchTimeout(url, f"no complete response within {total}s") from exc
        if logger.isEnabledFor(logging.DEBUG):
            ms = round((time.monotonic() - started) * 1000)
            extra = {"url": url, "final_url": download.final_url, "status": download.status}
            logger.debug("page fetched", extra=extra | {"bytes": len(download.body), "ms": ms})
        return download

    async def _revalidate(self, url: str, conditional: dict[str, str]) -> Download | None:
        """A revalidation on the lean path (`webctx.adapters.revalidate`): a 304 or 200
        Download, an HTTPStatusError, or None when the full path must fetch the URL (a
        redirect, a body the lean path does not read, a connection that failed)."""
        total = self._settings.total_timeout_s
        deadline = time.monotonic() + total
        if self._client is None:  # robots.txt is read through the full client
            self._client = self._new_client()
        if self._revalidator is None:
            self._revalidator = self._new_revalidator()
        target = checked_url(url)
        try:
            async with asyncio.timeout(total):
                if self._politeness is not None:
                    await self._be_polite(self._politeness, self._client, target, deadline)
                async with self._host_slot(url, target.host, deadline):
                    with translated(url):
                        answer = await self._revalidator.ask(
                            target, conditional, types=_LEAN_TYPES,
                            max_body=self._settings.max_bytes,
                        )  # fmt: skip
        except TimeoutError as exc:
            raise FetchTimeout(url, f"no complete response within {total}s") from exc
        except FetchError as exc:
            raise exc if exc.url == url else for_url(exc, url) from exc
        if answer is None:
            return None
        headers = answer.headers
        self._note(target.host, answer.status, headers.get("retry-after"))
        if answer.status == 304:
            return _with_tdmrep(not_modified(url, url, headers))
        if not 200 <= answer.status < 300:
            raise HTTPStatusError(url, f"HTTP {answer.status}", status=answer.status)
        media, charset, _ = checked_head(url, headers, _LEAN_TYPES, self._settings.max_bytes)
        decoder = BodyDecoder(url, headers.get("content-encoding", ""), self._settings.max_bytes)
        decoder.feed(answer.body)
        body = decoder.finish()
        return _with_tdmrep(body_download(url, url, answer.status, headers, media, charset, body))

    def _new_revalidator(self) -> Revalidator:
        s = self._settings
        backend = GuardedBackend(self._policy, self._resolver, self._dns,
                                 frozenset(s.allowed_ports))  # fmt: skip
        return Revalidator(
            backend, ssl_context=self._ssl_context, user_agent=s.user_agent,
            accept=_HEADERS["Accept"], connect_timeout_s=s.connect_timeout_s,
            read_timeout_s=s.read_timeout_s, keepalive_s=KEEPALIVE_S,
            max_idle_per_origin=s.per_host_concurrency,
        )  # fmt: skip

    def _new_client(self) -> httpx.AsyncClient:
        ports = frozenset(self._settings.allowed_ports)
        backend = GuardedBackend(self._policy, self._resolver, self._dns, ports)
        s = self._settings
        timeout = httpx.Timeout(s.read_timeout_s, connect=s.connect_timeout_s)
        return guarded_client(
            backend, ssl_context=self._ssl_context, connections=max(10, 2 * s.concurrency),
            keepalive_s=KEEPALIVE_S, timeout=timeout,
            headers={"User-Agent": s.user_agent, **_HEADERS},
        )  # fmt: skip

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
            raise for_url(exc, url) from exc
        except httpx.HTTPError as exc:  # anything the transport did not translate
            raise FetchError(url, f"{type(exc).__name__}: {exc}") from exc
        except httpx.InvalidURL as exc:  # no HTTPError: httpx parses a Location it won't follow
            raise InvalidRedirect(url, f"redirect to an unparsable URL: {exc}") from exc
        raise FetchError(url, f"more than {self._settings.max_redirects} redirects")

    async def _hop(
        self, client: httpx.AsyncClient, url: str, current: str, deadline: float
    ) -> Download | str:
        """One request: the download, or the URL a redirect points to."""
        target = checked_url(current)
        if self._politeness is not None:
            await self._be_polite(self._politeness, client, target, deadline)
        async with self._host_slot(current, target.host, deadline):
            conditional = _CALL.get(({}, ACCEPTED_TYPES))[0]
            request = client.build_request("GET", target, headers=conditional)
            response = await client.send(request, stream=True)
            try:
                location = redirect_location(response)
                if location is None:
                    return await self._download(url, response)
            finally:
                await response.aclose()
        try:
            return str(target.join(location))
        except httpx.InvalidURL as exc:
            raise InvalidRedirect(current, f"bad redirect Location {location!r}: {exc}") from exc

    async def _be_polite(
        self, polite: Politeness, client: httpx.AsyncClient, target: httpx.URL, deadline: float
    ) -> None:
        """robots.txt (and tdmrep.json, read alongside: its verdict on this hop's URL goes
        to the download), then the host's turn; BlockedURL or FetchTimeout instead of
        waiting."""
        origin = f"{target.scheme}://{target.netloc.decode('ascii')}"
        tdmrep = polite.tdmrep.get(origin)
        pending = None
        if tdmrep is None:
            pending = asyncio.ensure_future(self._tdmrep.rules(polite, client, origin))
            pending.add_done_callback(lambda done: done.cancelled() or done.exception())
        rules = None
        try:
            if polite.respect_robots:
                rules = polite.robots.get(origin) or await self._robots.rules(
                    polite, client, origin
                )
                decision = rules.decide(str(target))
                if not decision.allowed:
                    raise BlockedURL(str(target), decision.reason())
            tdmrep = await pending if pending is not None else tdmrep
        finally:
            if pending is not None and not pending.done():
                pending.cancel()  # this waiter only: the shared request goes on
        _TDMREP.set(tdmrep.decide(str(target)) if tdmrep is not None else None)
        delay = rules.crawl_delay if rules is not None else None
        wait = polite.pacer.reserve(target.host, delay_s=delay, latest=deadline)
        if wait is None:
            raise FetchTimeout(str(target), f"{target.host} is paced or paused past the deadline")
        await asyncio.sleep(wait)

    @contextlib.asynccontextmanager
    async def _host_slot(self, url: str, host: str, deadline: float) -> AsyncIterator[None]:
        slot = self._slots.get(host)
        if slot is None:
            slot = asyncio.Semaphore(self._settings.per_host_concurrency)
            self._slots[host] = slot
        try:
            if slot.locked():  # wait for a slot, until the deadline at most
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await slot.acquire()
            else:
                await slot.acquire()  # free: returns at once
        except TimeoutError:
            message = f"no free connection slot for {host} before the deadline"
            raise NoSlot(url, message) from None
        try:
            yield
        finally:
            slot.release()

    async def _download(self, url: str, response: httpx.Response) -> Download:
        final_url = str(response.url)
        self._note_status(response)
        conditional, types = _CALL.get(({}, ACCEPTED_TYPES))
        if response.status_code == 304 and conditional:
            async for _ in response.aiter_raw():  # no body (h11 knows); ends the message,
                pass  # so the connection goes back to the pool instead of being closed
            return _with_tdmrep(not_modified(url, final_url, response.headers))
        if not 200 <= response.status_code < 300:
            if drainable(response.headers):  # read it to its end: keep the connection
                async for _ in response.aiter_raw():
                    pass
            raise HTTPStatusError(
                final_url, f"HTTP {response.status_code}", status=response.status_code
            )
        s = self._settings
        media, charset, limit = checked_head(
            final_url, response.headers, types, s.max_bytes, pdf_max_bytes=s.pdf_max_bytes
        )
        decoder = BodyDecoder(final_url, response.headers.get("content-encoding", ""), limit)
        async for raw in response.aiter_raw():
            decoder.feed(raw)
        return _with_tdmrep(body_download(url, final_url, response.status_code, response.headers,
                                          media, charset, decoder.finish()))  # fmt: skip

    def _note_status(self, response: httpx.Response) -> None:
        self._note(response.url.host, response.status_code, response.headers.get("retry-after"))

    def _note(self, host: str, status: int, retry_after: str | None) -> None:
        """Tell the pacer how the host is doing: 429/503 pause it, anything else does not."""
        if self._politeness is None:
            return
        pacer = self._politeness.pacer
        if status in (429, 503):
            pause = pacer.busy(host, parse_retry_after(retry_after))
            logger.info("host paused", extra={"host": host, "status": status,
                                              "pause_s": pause})  # fmt: skip
        else:
            pacer.ok(host)


def _with_tdmrep(download: Download) -> Download:
    """The download with the tdmrep.json rule reserving its URL (found by _be_polite)."""
    rule = _TDMREP.get(None)
    return download.model_copy(update={"tdmrep_rule": rule}) if rule else download
