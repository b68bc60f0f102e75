"""The `webctx` command line (typer), one module per command group."""
