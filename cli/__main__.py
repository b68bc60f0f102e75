"""`python -m webctx.cli ...`: the `webctx` command."""

from webctx.cli.main import entry

entry()
