"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from qdrant_client import QdrantClient

from webctx.adapters.edge_store import EdgeVectorStore
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.adapters.qdrant_store import QdrantVectorStore
from webctx.ports import LiveIndexStore


@pytest.fixture(params=["memory", "edge", "qdrant-memory"])
def index_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveIndexStore]:
    """Each index-capable store in turn: in memory, the embedded engine, qdrant-client's
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
