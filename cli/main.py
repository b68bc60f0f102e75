"""The `webctx` console script: reaches the local service first (when the command is one
of its clients), then loads the command line (`webctx.cli.app`)."""

from __future__ import annotations

import atexit
import gc
import os
import sys
from typing import NoReturn

from webctx.cli.collector import SETTLES_ITSELF, settle
from webctx.cli.interrupt import INTERRUPTED_EXIT, Interrupted, waits, watch


def main() -> None:
    """Console-script entry point."""
    # A command's imports make ~75k objects that live as long as it does; the collector
    # walked them over and over while they loaded, and once more at exit. Off until the
    # command has loaded, then frozen: `webctx research` ~0.15 s sooner a question
    # (docs/benchmarks.md, "latency").
    gc.disable()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    from webctx.workers.service_client import reach_early

    reach_early(sys.argv[1:], dict(os.environ))
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    handed = None
    if command == "research":  # its own modules only, before its job is submitted
        from webctx.cli.handover import hand_over_early

        handed = hand_over_early(sys.argv[2:])  # before the parser loads, when it can
        if handed is not None and waits(sys.argv[2:]):
            watch(handed)  # Ctrl-C from here on cancels it (webctx.cli.interrupt)
        from webctx.cli.jobs import research_cli

        cli = research_cli(handed=handed)
    else:
        from webctx.cli.app import cli
    # `webctx config` says it among the rest; the service said it for a `webctx research`
    # it took (webctx/cli/handover.py).
    shows_config = command == "config" and sys.argv[2:3] not in (["set"], ["unset"], ["path"])
    if not shows_config and handed is None:
        from webctx.cli.config_set import warn_about_names

        warn_about_names(os.environ)
    if command not in SETTLES_ITSELF:
        settle(collect=True)  # workers, servers and batch feeders run for long
    try:
        cli()
    finally:
        if not gc.isenabled():  # a command that ended before it settled: about to exit
            settle()


def entry() -> None:
    """The `webctx` console script (and `python -m webctx.cli`): `main`, after which a
    finished `webctx research` leaves at once, and one interrupted cancels its job."""
    try:
        try:
            main()
        except Interrupted as stop:
            from webctx.cli.interrupt import cancel_interrupted

            cancel_interrupted(stop.job_id)
        except KeyboardInterrupt:
            if sys.argv[1:2] != ["research"]:
                raise
            sys.stderr.write("interrupted: no job was submitted\n")
            raise SystemExit(INTERRUPTED_EXIT) from None
    except SystemExit as done:
        if sys.argv[1:2] == ["research"]:
            _leave(done)
        raise
    except Exception as exc:
        if type(exc).__name__ != "ValidationError" or getattr(exc, "title", "") != "Settings":
            raise
        _refuse_settings(exc)


def _refuse_settings(exc: Exception) -> NoReturn:
    """Invalid settings (the environment's, at any command) in plain words, each named by
    its variable, instead of pydantic's traceback."""
    from webctx.problems import plain_message

    def variable(loc: tuple[object, ...]) -> str:
        first = str(loc[0]) if loc else ""
        if first.isupper():  # a setting read from its own name (OPENAI_API_KEY)
            return first
        return "WEBCTX_" + "__".join(str(part) for part in loc).upper()

    errors = [{**e, "loc": (variable(tuple(e["loc"])),)} for e in exc.errors()]  # type: ignore[attr-defined]
    sys.stderr.write(f"error: invalid settings: {plain_message(errors)}\n")
    raise SystemExit(2)


def _leave(done: SystemExit) -> NoReturn:
    """Exit without tearing the interpreter down: freeing what `webctx research` loaded
    took ~40 ms after its answer was printed, and its caller (an agent, a script) waits
    for the exit. Its output is flushed here and its threads are daemons."""
    code = done.code
    if code is not None and not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # the reader went away: as Python exits then
        code = code or 120
    os._exit(code or 0)


if __name__ == "__main__":
    entry()
