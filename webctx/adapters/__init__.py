"""Implementations of the Protocols in webctx.ports, one file per backend."""
