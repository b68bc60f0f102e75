"""The PointIO (index export and import) of a vector store adapter."""

from __future__ import annotations

import functools

from webctx.errors import ConfigError
from webctx.index.transfer import Points


def point_io(store: object) -> Points:
    """Dump and load functions over the store's points; ConfigError for a store that has
    none (the in-memory one)."""
    from webctx.adapters.edge_store import EdgeVectorStore
    from webctx.adapters.qdrant_store import QdrantVectorStore

    if isinstance(store, EdgeVectorStore):
        from webctx.adapters import edge_points as engine
    elif isinstance(store, QdrantVectorStore):
        from webctx.adapters import qdrant_points as engine  # type: ignore[no-redef]
    else:
        raise ConfigError(f"a {type(store).__name__} cannot export or import an index")
    return Points(functools.partial(engine.dump_points, store),  # type: ignore[arg-type]
                  functools.partial(engine.load_points, store))  # type: ignore[arg-type]  # fmt: skip
