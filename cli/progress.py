"""Job progress on stderr: a live display on a TTY, plain log lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from webctx.errors import WebctxError
from webctx.jobs.store import JobProgress


def describe(p: JobProgress) -> str:
    """One line: what the job has done so far."""
    return (
        f"job {p.job_id[:8]} {p.status.value}: "
        f"searched {p.searched}/{p.queries} queries, "
        f"fetched {p.fetched}/{p.urls} pages ({p.failed} failed), "
        f"embedded {p.embedded}/{p.urls} "
        f"({p.counters.get('chunks', 0)} chunks, {p.counters.get('tokens_embedded', 0)} tokens)"
    )


def wait_for_job(
    poll: Callable[[], JobProgress],
    *,
    timeout_s: float,
    stream: TextIO | None = None,
    interval_s: float = 0.2,
    pause: Callable[[float], object] = time.sleep,
) -> JobProgress:
    """Poll until the job finishes, showing progress; WebctxError on timeout. Between polls
    it waits in `pause(interval_s)`, which may return early: when the job ends (the job
    store's `wait_finished`), so the bundle comes without waiting out the interval."""
    stream = stream or sys.stderr
    deadline = time.monotonic() + timeout_s
    if stream.isatty():
        from rich.console import Console  # a live display only on a terminal
        from rich.live import Live
        from rich.text import Text

        console = Console(file=stream)
        with Live(
            Text("starting…"), console=console, transient=False, refresh_per_second=8
        ) as live:
            return _loop(poll, deadline, lambda: pause(interval_s),
                         lambda line: live.update(Text(line)))  # fmt: skip
    last = [""]

    def emit(line: str) -> None:
        if line != last[0]:
            print(line, file=stream, flush=True)
            last[0] = line

    return _loop(poll, deadline, lambda: pause(interval_s), emit)


def _loop(
    poll: Callable[[], JobProgress],
    deadline: float,
    pause: Callable[[], object],
    show: Callable[[str], None],
) -> JobProgress:
    while True:
        progress = poll()
        show(describe(progress))
        if progress.finished:
            return progress
        if time.monotonic() > deadline:
            raise WebctxError(f"timed out waiting for job {progress.job_id}: {describe(progress)}")
        pause()
