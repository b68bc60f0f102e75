"""The garbage collector of a command-line process: off while a command loads, then on
with what loaded left out (`webctx.cli.main`)."""

from __future__ import annotations

import gc

SETTLES_ITSELF = frozenset({"research"})
"""Commands that call `settle()` themselves, once their imports are done: `research` loads
its submission path lazily and then waits for the job, collecting nothing it loaded."""


def settle(*, collect: bool = False) -> None:
    """Collect garbage again, leaving out every object alive now (the modules, settings and
    clients the command loaded, which live as long as it does): the collector never walks
    them again, when the process exits either. `collect`: first free what loading left
    unreachable (a few MB, ~45 ms), for a command that may run for long; without it that
    stays until the process exits."""
    if collect:
        gc.collect()
    gc.freeze()
    gc.enable()
