"""The PointIO (index export and import) of a vector store adapter."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from webctx.errors import ConfigError
from webctx.stages.store import RawPoint


class Points:
    """A store's points out and in by half ("dense", "sparse"): the PointIO of
    `webctx.index.transfer`."""

    def __init__(self, store: object) -> None:
        from webctx.adapters.edge_store import EdgeVectorStore
        from webctx.adapters.qdrant_store import QdrantVectorStore

        if not isinstance(store, EdgeVectorStore | QdrantVectorStore):
            raise ConfigError(f"a {type(store).__name__} cannot export or import an index")
        self.store = store

    def dump(self, half: str) -> Iterator[RawPoint]:
        """Every point of the half, as stored."""
        from webctx.adapters import edge_points, qdrant_points
        from webctx.adapters.edge_store import EdgeVectorStore

        if isinstance(self.store, EdgeVectorStore):
            return edge_points.dump_points(self.store, half)
        return qdrant_points.dump_points(self.store, half)

    def load(self, half: str, points: Sequence[RawPoint]) -> None:
        """Upsert points into the half, by id."""
        from webctx.adapters import edge_points, qdrant_points
        from webctx.adapters.edge_store import EdgeVectorStore

        if isinstance(self.store, EdgeVectorStore):
            edge_points.load_points(self.store, half, points)
        else:
            qdrant_points.load_points(self.store, half, points)


def point_io(store: object) -> Points:
    """The PointIO of a store; ConfigError for one that has none (the in-memory one)."""
    return Points(store)
