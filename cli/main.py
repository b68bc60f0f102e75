"""The `webctx` console script: reaches the local service first (when the command is one
of its clients), then loads the command line (`webctx.cli.app`)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    from webctx.workers.service_client import reach_early

    reach_early(sys.argv[1:], dict(os.environ))
    from webctx.cli.app import cli

    cli()


if __name__ == "__main__":
    main()
