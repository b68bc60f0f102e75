"""One flush for many page writes: a research job's store step on the embedded engine.

The embedded engine (qdrant-edge) makes writes durable at its flush, which holds the GIL
for its whole fsync: 8 ms quiet, over 100 ms with the disk busy. A flush after each page
stalled every other thread of the worker that often, downloads' extraction and the last
page of a job among them. Here a page's points are written at once (searchable for the
job's rank straight away) and made durable by a flush that waits for the writes to pause
(`quiet_s`, default 0.5 s) but never longer than `max_delay_s` (default 5 s).

What may only follow durability, the page's stored mark (which makes later jobs skip the
page) and the drop of its staged vectors, runs after that flush. A process killed before it
loses the writes, and the marks with them: the next job that wants the page stores it
again. A flush that fails drops its marks in the same way (logged).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from webctx.protocols import GroupFlushable

logger = logging.getLogger(__name__)

QUIET_S = 0.5
MAX_DELAY_S = 5.0


class GroupFlush:
    """Writes made durable together by one background thread's flush."""

    def __init__(
        self,
        store: GroupFlushable,
        *,
        quiet_s: float | None = None,
        max_delay_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.max_delay_s = MAX_DELAY_S if max_delay_s is None else max_delay_s
        self._clock = clock
        self._changed = threading.Condition()
        self._waiting: list[Callable[[], None]] = []
        self._first = self._last = 0.0
        self._closed = False
        self._flushing = threading.Lock()  # one flush at a time: the thread's, or close's
        self._thread = threading.Thread(target=self._run, name="group-flush", daemon=True)
        self._thread.start()

    def after_flush(self, then: Callable[[], None]) -> None:
        """Run `then` once every write made before this call is durable (after a flush of
        its own, at once, once the group flush is closed: a worker shutting down)."""
        with self._changed:
            closed = self._closed
            if not closed:
                now = self._clock()
                if not self._waiting:
                    self._first = now
                self._last = now
                self._waiting.append(then)
                self._changed.notify()
        if closed:
            self._flush([then])

    def pending(self) -> int:
        """How many callers wait for the next flush."""
        with self._changed:
            return len(self._waiting)

    def flush_now(self) -> None:
        """Flush at once and run what waited for it."""
        with self._changed:
            taken, self._waiting = self._waiting, []
        self._flush(taken)

    def close(self) -> None:
        """Flush what waits, then stop the thread (later writes are flushed one by one)."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join()
        self.flush_now()

    def _due_in(self) -> float | None:
        """Seconds until the waiting writes are due for a flush (0: now); None: none wait."""
        if not self._waiting:
            return None
        now = self._clock()
        return max(0.0, min(self._last + self.quiet_s, self._first + self.max_delay_s) - now)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._closed and (wait := self._due_in()) != 0.0:
                    self._changed.wait(timeout=wait)
                if self._closed:
                    return
                taken, self._waiting = self._waiting, []
            self._flush(taken)

    def _flush(self, taken: list[Callable[[], None]]) -> None:
        with self._flushing:
            if not taken:
                return
            try:
                self._store.flush()
            except Exception:  # marks not written: the pages are stored again when wanted
                logger.exception("vector store flush failed", extra={"writes": len(taken)})
                return
            for then in taken:
                try:
                    then()
                except Exception:  # one page's mark lost (Redis down): it is stored again
                    logger.exception("after-flush step failed")
