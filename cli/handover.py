"""`webctx research` handed to the running local service as typed, before the command
line's parser loads (webctx/api/inbox.py, `hand_over_argv`).

Parsing the command line costs the command ~0.1 s before its job can start: importing
typer (which imports pydantic) and its first parse (pydantic builds a validator per
option). The local service has both loaded already, and the same definition of the
command: so the command hands it the words it was given, the service parses them as the
command would and submits, and the command loads its parser while the job runs, to wait
for it and print it. A command line the service does not parse (a usage error, another
version of webctx) is handed back untouched: the command parses it and says why, or
hands over the request it parsed, as before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import webctx
from webctx.cli.interrupt import Interrupted, waits

HELP = frozenset({"--help", "-h"})
RESEARCH_MODULE = Path(__file__).with_name("jobs.py")
"""The file that defines `webctx research` (its options)."""
KNOBS_MODULE = Path(webctx.__file__).with_name("knobs.py")
"""The file that holds the options' defaults and ranges (the job knobs' table)."""


def definition(path: Path = RESEARCH_MODULE) -> str:
    """Which definition of the command this process has: webctx's version and the
    defining files' sizes and modification times (a reinstalled or edited webctx differs)."""
    stats = [p.stat() for p in (path, KNOBS_MODULE)]
    return ":".join([webctx.__version__, *(f"{s.st_size}:{s.st_mtime_ns}" for s in stats)])


def hand_over_early(argv: list[str]) -> str | None:
    """The job id when the running local service took `webctx research` with `argv` (the
    words after `research`), else None: no service runs, a broker is set, the words ask
    for help, or the service did not parse them (the command goes on as before). A
    request the service parsed and refused ends the command with the service's error, as
    `webctx.cli.common.fail` prints one."""
    from webctx.api.inbox import hand_over_argv
    from webctx.workers.service_client import local_data_dir

    data_dir = local_data_dir(dict(os.environ))
    if data_dir is None or HELP & set(argv):
        return None
    names = [name for name in os.environ if name.upper().startswith("WEBCTX_")]
    answer = hand_over_argv(data_dir, argv, definition=definition(), names=names)
    if answer is None or answer.get("unparsed"):
        return None
    if "job_id" in answer:
        for line in answer.get("warnings") or ():  # what the command would have said
            sys.stderr.write(f"{line}\n")
        if answer.get("interrupted") and waits(argv):  # Ctrl-C while it was submitted
            raise Interrupted(str(answer["job_id"]))  # a --no-wait job: its id is printed
        return str(answer["job_id"])
    if answer.get("interrupted"):
        raise KeyboardInterrupt
    sys.stderr.write(f"error: {answer.get('error')}\n")
    raise SystemExit(int(answer.get("code") or 1))
