"""Pages rendered by script: the system's headless Chromium, driven by Playwright.

- The browser comes from the system (`WEBCTX_RENDER__BROWSER`, else chromium on PATH),
  launched with `executable_path`: nothing is downloaded. Without it (or without the
  `render` extra) `find_browser` says None and the job fails the page `needs_render`.
- The browser opens no connection itself: it resolves no name (`--host-resolver-rules`),
  every request of a page's context is answered through the fetch guard
  (`webctx.adapters.browser_route`), websockets are closed unopened and service workers
  blocked (their requests would not pass the context's route).
- One browser per process, launched on first use and reused (cold start about 1.5 s);
  each page gets a fresh context (no cookies or storage shared between pages), a deadline
  over the whole render, a byte budget, a V8 heap cap per renderer, and the browser is
  restarted after a page when its processes together hold more than `memory_mb`.
- Playwright's async API on a loop thread of our own (`FetchLoop`): Celery's thread pool
  calls `render` from many threads, which Playwright's sync API does not allow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from webctx.adapters.browser_route import GuardedRoute, PageBudget
from webctx.adapters.fetch_loop import FetchLoop
from webctx.adapters.guarded_transport import GuardedBackend, guarded_client
from webctx.errors import BlockedURL, FetchError, FetchTimeout, HTTPStatusError, NeedsRender
from webctx.models import Download
from webctx.net.addresses import AddressPolicy, Resolver, check_url, system_resolver
from webctx.settings import FetchSettings, RenderSettings

if TYPE_CHECKING:
    from playwright.async_api import Browser, Playwright, WebSocketRoute

logger = logging.getLogger(__name__)

INSTALL_HINT = NeedsRender.INSTALL_HINT
_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_LAUNCH_GRACE_S = 30.0  # a cold launch, on top of the page's own deadline


def find_browser(configured: str = "") -> str | None:
    """The Chromium executable to drive, or None (no browser, or no Playwright)."""
    if importlib.util.find_spec("playwright") is None:
        return None
    for name in (configured,) if configured else _NAMES:
        found = shutil.which(name)
        if found and os.access(found, os.X_OK):
            return found
    return None


def launch_args(render: RenderSettings) -> list[str]:
    """Chromium's flags: no name resolution, no background traffic, capped JS heaps."""
    return [
        "--host-resolver-rules=MAP * ~NOTFOUND",  # every request is answered by the route
        "--dns-prefetch-disable",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-domain-reliability",
        "--disable-sync",
        "--no-pings",
        "--no-first-run",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",  # no STUN over UDP
        "--disable-dev-shm-usage",  # containers' /dev/shm is 64 MB
        f"--js-flags=--max-old-space-size={render.js_heap_mb}",
    ]


class ChromiumRenderer:
    """Renders pages in one reused headless Chromium; thread-safe."""

    def __init__(
        self,
        render: RenderSettings,
        fetch: FetchSettings,
        *,
        executable: str,
        policy: AddressPolicy,
        resolver: Resolver = system_resolver,
    ) -> None:
        self._render_settings, self._fetch_settings = render, fetch
        self._executable = executable
        self._policy, self._resolver = policy, resolver
        self._dns = ThreadPoolExecutor(4, thread_name_prefix="webctx-render-dns")
        self._ssl_context = httpx.create_ssl_context()
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._client: httpx.AsyncClient | None = None
        self._gate: asyncio.Semaphore | None = None
        self._launching: asyncio.Lock | None = None
        self._active = 0
        self._loop = FetchLoop(name="webctx-render-loop", on_start=self._forget_loop_state)

    def render(self, url: str) -> Download:
        """The DOM of `url` once its scripts ran, as an HTML Download; FetchError subclasses
        otherwise (BlockedURL when the guard refused the page itself)."""
        check_url(url)
        future = self._loop.submit(self._render(url))
        try:
            return future.result(timeout=self._render_settings.page_timeout_s + _LAUNCH_GRACE_S)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise FetchTimeout(url, "the browser did not answer in time") from exc

    def close(self) -> None:
        """Close the browser and its driver, stop the loop."""
        self._loop.stop(self._shutdown(), timeout_s=10.0)
        self._dns.shutdown(wait=False, cancel_futures=True)

    def _forget_loop_state(self) -> None:
        self._playwright, self._browser, self._client = None, None, None
        self._gate = asyncio.Semaphore(self._render_settings.concurrency)
        self._launching = asyncio.Lock()
        self._active = 0

    async def _render(self, url: str) -> Download:
        assert self._gate is not None  # set when the loop started
        async with self._gate:
            browser = await self._browser_now(url)
            self._active += 1
            started = time.monotonic()
            try:
                async with asyncio.timeout(self._render_settings.page_timeout_s):
                    download = await self._load(browser, url)
            except TimeoutError as exc:
                limit = self._render_settings.page_timeout_s
                raise FetchTimeout(url, f"the page did not render within {limit}s") from exc
            except FetchError:
                raise
            except Exception as exc:  # Playwright's errors: a crashed renderer, a closed page
                raise FetchError(url, f"browser: {_line(exc)}") from exc
            finally:
                self._active -= 1
                await self._cap_memory()
        ms = round((time.monotonic() - started) * 1000)
        logger.info("page rendered", extra={"url": url, "ms": ms, "bytes": len(download.body)})
        return download

    async def _browser_now(self, url: str) -> Browser:
        """The running browser, launched (again) when there is none or it died."""
        assert self._launching is not None
        async with self._launching:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            try:
                from playwright.async_api import async_playwright
            except ImportError as exc:
                raise NeedsRender(url, f"the page is rendered by script; {INSTALL_HINT}") from exc
            started = time.monotonic()
            if self._playwright is None:
                self._playwright = await async_playwright().start()
            try:
                self._browser = await self._playwright.chromium.launch(
                    executable_path=self._executable, headless=True,
                    args=launch_args(self._render_settings),
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - Playwright's errors: one line is enough
                raise NeedsRender(url, f"the browser did not start ({_line(exc)}); "
                                       f"{INSTALL_HINT}") from exc  # fmt: skip
            ms = round((time.monotonic() - started) * 1000)
            logger.info("browser started", extra={"executable": self._executable, "ms": ms})
            return self._browser

    async def _load(self, browser: Browser, url: str) -> Download:
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        fetch = self._fetch_settings
        context = await browser.new_context(
            service_workers="block", user_agent=fetch.user_agent, accept_downloads=False
        )
        budget = PageBudget(self._render_settings.max_page_bytes)
        try:
            route = GuardedRoute(self._http(), budget, per_request=fetch.max_bytes,
                                 redirects=fetch.max_redirects)  # fmt: skip
            await context.route("**/*", route)
            await context.route_web_socket("**/*", _refuse_socket)
            page = await context.new_page()
            try:
                response = await page.goto(url, wait_until="load")
                moved = route.moved.get(url)
                if moved is not None:  # the frame moves on by itself (GuardedRoute)
                    await page.wait_for_url(lambda u: u == moved[0], wait_until="load")
            except PlaywrightError as exc:
                if "ERR_BLOCKED_BY_CLIENT" in str(exc):
                    raise BlockedURL(url, "the fetch guard refused the page") from exc
                raise FetchError(url, f"browser: {_line(exc)}") from exc
            status = moved[1] if moved is not None else response.status if response else 200
            if status >= 400:
                raise HTTPStatusError(url, f"HTTP {status}", status=status)
            with contextlib.suppress(PlaywrightTimeout):  # a page that keeps polling
                settle = self._render_settings.settle_ms
                await page.wait_for_load_state("networkidle", timeout=max(settle * 4, 1))
            try:
                html = await page.content()
            except PlaywrightError:  # navigating at that moment: read it once it has loaded
                await page.wait_for_load_state("load")
                html = await page.content()
            final_url = page.url
            if not final_url.startswith(("http://", "https://")):  # chrome-error://…
                if budget.refused:
                    raise BlockedURL(url, "the page moved where the fetch guard refused to go")
                raise FetchError(url, f"the page ended on {final_url[:60]}")
        finally:
            with contextlib.suppress(Exception):
                await context.close()
        html_type = "text/html; charset=utf-8"
        return Download(url=url, final_url=final_url, status=200, content_type=html_type,
                        body=html.encode("utf-8"))  # fmt: skip

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            s = self._fetch_settings
            backend = GuardedBackend(self._policy, self._resolver, self._dns,
                                     frozenset(s.allowed_ports))  # fmt: skip
            self._client = guarded_client(
                backend, ssl_context=self._ssl_context, connections=16, keepalive_s=2.0,
                timeout=httpx.Timeout(s.read_timeout_s, connect=s.connect_timeout_s),
                headers={"User-Agent": s.user_agent},
            )  # fmt: skip
        return self._client

    async def _cap_memory(self) -> None:
        """Close the browser when its processes hold more than the cap (and no page is
        rendering): the next page launches a fresh one."""
        browser = self._browser
        if browser is None or self._active:
            return
        used = browser_rss_mb()
        if used > self._render_settings.memory_mb:
            logger.warning("browser restarted", extra={"rss_mb": used})
            self._browser = None
            with contextlib.suppress(Exception):
                await browser.close()

    async def _shutdown(self) -> None:
        client, self._client = self._client, None
        browser, self._browser = self._browser, None
        driver, self._playwright = self._playwright, None
        for closing in (client.aclose() if client else None, browser.close() if browser else None,
                        driver.stop() if driver else None):  # fmt: skip
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing


async def _refuse_socket(socket: WebSocketRoute) -> None:
    """A page's websocket: closed without connecting (the route cannot guard its frames)."""
    await socket.close(code=1008, reason="websockets are not allowed while rendering")


def _line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def browser_rss_mb(root: int | None = None) -> int:
    """Resident memory (MB) of the Chromium processes descending from `root` (this
    process); 0 where /proc is not there."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = entry.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    pending, total_pages = list(children.get(root or os.getpid(), [])), 0
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        with contextlib.suppress(OSError, ValueError, IndexError):
            if "chrom" in (proc / str(pid) / "comm").read_text():
                total_pages += int((proc / str(pid) / "statm").read_text().split()[1])
    return total_pages * os.sysconf("SC_PAGE_SIZE") // 1_000_000
