"""A worker's fetcher keeps every fetch its threads run at once in flight: its connection
pool is not the bound (a 20-source job's pages beyond it waited for a free connection,
each up to a whole page's download late)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from starlette.types import Receive, Scope, Send

from webctx.devweb.server import LoopbackServer
from webctx.settings import FetchSettings, Settings
from webctx.workers.deps import build_fetcher

ARTICLE = (
    "<html><head><title>Pool</title></head><body><article>"
    + "<p>A paragraph of plain text long enough to be the main content of the page.</p>" * 20
    + "</article></body></html>"
).encode()


class Gathering:
    """An app holding each page request until `expected` are in flight at once (or a few
    seconds pass), recording the most it saw together."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.in_flight = 0
        self.most = 0
        self._all_here: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/page":
            await _answer(send, 404, b"not found", "text/plain")
            return
        if self._all_here is None:
            self._all_here = asyncio.Event()
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight >= self.expected:
            self._all_here.set()
        try:
            await asyncio.wait_for(self._all_here.wait(), timeout=3.0)
        except TimeoutError:
            pass
        await _answer(send, 200, ARTICLE, "text/html; charset=utf-8")
        self.in_flight -= 1


async def _answer(send: Send, status: int, body: bytes, media: str) -> None:
    headers = [(b"content-type", media.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _fetch_together(settings: Settings, fetches: int) -> int:
    """`fetches` threads each fetching the page through the worker's fetcher at once; the
    most requests the server had in flight together."""
    app = Gathering(fetches)
    fetcher = build_fetcher(settings)
    errors: list[BaseException] = []
    try:
        with LoopbackServer(app) as server:

            def fetch() -> None:
                try:
                    fetcher.fetch(f"{server.url}/page")
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=fetch) for _ in range(fetches)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
    finally:
        fetcher.close()
    assert not errors, errors
    return app.most


def _settings(**update: object) -> Settings:
    # One origin, its per-host bound lifted: only the connection pool can hold fetches back.
    fetch = FetchSettings(per_host_concurrency=64, per_host_delay_s=0.0, respect_robots=False)
    return Settings(fetch=fetch, allowed_networks=["127.0.0.1/32"], **update)  # type: ignore[arg-type]


def test_the_worker_fetcher_keeps_one_fetch_per_worker_thread_in_flight() -> None:
    settings = _settings()
    assert _fetch_together(settings, settings.worker_concurrency) == settings.worker_concurrency


def test_more_worker_threads_than_fetch_concurrency_widen_the_pool_with_them() -> None:
    settings = _settings(worker_concurrency=48)
    assert settings.fetch.concurrency < 48
    assert _fetch_together(settings, 48) == 48


@pytest.mark.parametrize(
    "args",
    [["-c", "48"], ["-c48"], ["--concurrency", "48"], ["--concurrency=48"],
     ["-Q", "fetch", "-c", "48"]],  # fmt: skip
)
def test_a_worker_given_more_threads_on_its_command_line_widens_its_fetch_pool_with_them(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from webctx.cli.serve import apply_concurrency, concurrency_arg
    from webctx.settings import get_settings

    monkeypatch.delenv("WEBCTX_WORKER_CONCURRENCY", raising=False)
    get_settings.cache_clear()
    try:
        assert concurrency_arg(args) == 48
        assert apply_concurrency(args).worker_concurrency == 48  # what the fetcher is built from
        settings = _settings(worker_concurrency=get_settings().worker_concurrency)
        assert _fetch_together(settings, 48) == 48
    finally:
        monkeypatch.delenv("WEBCTX_WORKER_CONCURRENCY", raising=False)
        get_settings.cache_clear()


def test_a_worker_without_a_thread_count_keeps_the_settings() -> None:
    from webctx.cli.serve import concurrency_arg

    assert concurrency_arg(["-Q", "fetch", "--pool", "threads"]) is None
    assert concurrency_arg(["-c", "many"]) is None
