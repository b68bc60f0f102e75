"""Ctrl-C on a `webctx research` that waits for its job: the job is cancelled, the command
says so in one line and exits 130 (a second Ctrl-C while it cancels exits at once).

Once the command knows the job it waits for (handed to the local service before the
command line's parser loads, or submitted by the command itself), SIGINT raises
`Interrupted` instead of KeyboardInterrupt: click turns a KeyboardInterrupt into its own
exit inside the command, and the job would go on. `Interrupted` passes through click,
typer, rich's live display and redis-py's blocking reads, to the console script's entry
(`webctx.cli.main.entry`), which cancels the job through the one path every way in
shares (`webctx.api.runtime.cancel`). A `--no-wait` job is never watched: nothing the
command does afterwards cancels it.

This module is imported before the parser loads: the standard library only, at the top.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

Handler = Callable[[int, FrameType | None], None]

INTERRUPTED_EXIT = 130
"""128 + SIGINT, as shells report a command ended by Ctrl-C."""


class Interrupted(BaseException):
    """Ctrl-C while the command waited for job `job_id` (not an Exception: nothing on the
    way up may take it for an error of its own and carry on)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


def watch(job_id: str | None) -> None:
    """From now on Ctrl-C raises Interrupted(job_id); with None, KeyboardInterrupt again."""
    if job_id is None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(job_id)

    signal.signal(signal.SIGINT, interrupt)


def waits(argv: list[str]) -> bool:
    """Whether `webctx research` with the words `argv` waits for its job (no `--no-wait`
    before a `--`): until the command has parsed its words, which then says for sure."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return "--no-wait" not in words


def cancel_interrupted(job_id: str) -> NoReturn:
    """Cancel the job whose wait Ctrl-C interrupted, say so on stderr, exit 130."""
    signal.signal(signal.SIGINT, _exit_at_once(job_id))
    try:
        status = _cancel(job_id)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # done: about to say so and leave
    except Exception as exc:  # noqa: BLE001 - the job state store unreachable, gone...
        _say(f"error: interrupted; job {job_id} could not be cancelled ({exc}): "
             f"`webctx cancel {job_id}` cancels it")  # fmt: skip
    else:
        if status == "cancelled":
            _say(f"cancelled job {job_id}")
        else:
            _say(f"interrupted; job {job_id} had {status} already (`webctx bundle {job_id}`)")
    raise SystemExit(INTERRUPTED_EXIT)


def _cancel(job_id: str) -> str:
    from webctx.api.runtime import cancel, open_runtime
    from webctx.settings import get_settings

    with open_runtime(get_settings()) as runtime:
        return cancel(runtime, job_id, reason="cancelled: the command was interrupted").status.value


def _exit_at_once(job_id: str) -> Handler:
    def leave(_signum: int, _frame: FrameType | None) -> None:
        _say(f"interrupted again: job {job_id} may still run (`webctx cancel {job_id}`)")
        os._exit(INTERRUPTED_EXIT)

    return leave


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:  # no one reads stderr any more
        pass
