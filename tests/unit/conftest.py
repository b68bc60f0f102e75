"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from qdrant_client import QdrantClient

from tests.fetch_site import Site, loopback_fetcher, serve_site
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.adapters.qdrant_store import QdrantVectorStore
from webctx.protocols import IndexStore


@pytest.fixture(params=["memory", "edge", "qdrant-memory"])
def index_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IndexStore]:
    """Each backend in turn, in its index roles: in memory, the embedded engine, qdrant-client's
    local mode (the server's API)."""
    if request.param == "memory":
        yield MemoryVectorStore()
    elif request.param == "edge":
        edge = EdgeVectorStore(tmp_path / "edge")
        yield edge
        edge.close()
    else:
        client = QdrantClient(":memory:")
        yield QdrantVectorStore(client, collection="chunks")
        client.close()


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    """The hostile loopback site of the fetcher's tests (tests/fetch_site.py)."""
    yield from serve_site()


@pytest.fixture(scope="module")
def fetcher() -> Iterator[HttpxFetcher]:
    """A fetcher allowed on 127.0.0.1 only, with no DNS."""
    yield from loopback_fetcher()
