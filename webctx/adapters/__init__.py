"""Implementations of the Protocols in webctx.protocols, one file per backend."""
