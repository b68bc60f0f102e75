"""The fetcher's event loop: one asyncio loop in a daemon thread of its own.

Started on first use and again in a forked child (a loop and its thread do not survive a
fork: a prefork worker's child would otherwise wait on a loop nobody runs). Whatever the
owner keeps per loop (clients, connection pools, semaphores) belongs to one loop only:
`on_start` is called when a new loop starts, so the owner drops it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class FetchLoop:
    """A lazily started event loop serving coroutines submitted from other threads."""

    def __init__(self, *, name: str, on_start: Callable[[], None]) -> None:
        self._name = name
        self._on_start = on_start
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def running(self) -> asyncio.AbstractEventLoop:
        """The loop of this process, started (and `on_start` called) if there is none."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid():  # first use, or forked
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), daemon=True,
                                          name=self._name)  # fmt: skip
                thread.start()
                self._loop, self._pid = loop, os.getpid()
                self._on_start()
            return self._loop

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `work` on the loop; the caller waits on (or cancels) the future."""
        return asyncio.run_coroutine_threadsafe(work, self.running())

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run `callback` on the loop's thread (e.g. release a semaphore of the loop)."""
        self.running().call_soon_threadsafe(callback)

    def stop(self, closing: Coroutine[Any, Any, None], *, timeout_s: float = 5.0) -> None:
        """Run `closing` on the loop (bounded by `timeout_s`), then stop it. A loop of the
        parent process (after a fork) is left alone: its thread is not in this process."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None or self._pid != os.getpid():
            closing.close()  # never awaited: say so, instead of a "never awaited" warning
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(closing, loop).result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's thread: run until `stop` stops it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()
