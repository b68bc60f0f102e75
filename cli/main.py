"""The `webctx` console script: reaches the local service first (when the command is one
of its clients), then loads the command line (`webctx.cli.app`)."""

from __future__ import annotations

import gc
import os
import sys

from webctx.cli.collector import SETTLES_ITSELF, settle


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
    if command == "research":  # its own modules only, before its job is submitted
        from webctx.cli.jobs import research_cli

        cli = research_cli()
    else:
        from webctx.cli.app import cli
    if command not in SETTLES_ITSELF:
        settle(collect=True)  # workers, servers and batch feeders run for long
    try:
        cli()
    finally:
        if not gc.isenabled():  # a command that ended before it settled: about to exit
            settle()


if __name__ == "__main__":
    main()
