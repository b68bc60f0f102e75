"""Every point of a QdrantVectorStore, as stored, out and in (`webctx index export/import`).

The same contract as `webctx.adapters.edge_points`: plain upserts under the points' own
ids, whole payloads, the payload indexes created before the points arrive.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import cast

from qdrant_client import models

from webctx.adapters.qdrant_store import SPARSE, QdrantVectorStore, _client
from webctx.stages.store import RawPoint, mark_fields

PAGE = 512


def dump_points(store: QdrantVectorStore, half: str) -> Iterator[RawPoint]:
    """The dense or sparse half's points, a page of scroll at a time."""
    if not (store._exists() if half == "dense" else store._sparse_exists()):
        return
    name = store.collection if half == "dense" else store._sparse_name
    offset: models.ExtendedPointId | None = None
    while True:
        records, offset = _client(functools.partial(
            store.client.scroll, name, limit=PAGE, offset=offset, with_payload=True,
            with_vectors=True))  # fmt: skip
        for record in records:
            payload = dict(record.payload or {})
            if half == "dense":
                dense = cast(list[float], record.vector)
                yield RawPoint(str(record.id), payload=payload, dense=[float(x) for x in dense])
            else:
                sv = record.vector[SPARSE] if isinstance(record.vector, dict) else None
                pair = (list(sv.indices), list(sv.values)) if isinstance(
                    sv, models.SparseVector) else ([], [])  # fmt: skip
                yield RawPoint(str(record.id), payload=payload, sparse=pair)
        if offset is None:
            return


def load_points(store: QdrantVectorStore, half: str, points: Sequence[RawPoint]) -> None:
    """Upsert points into the dense or sparse collection (created when absent)."""
    if not points:
        return
    if half == "dense":
        store._ensure_collection(len(points[0].dense or []))
        name = store.collection
        structs = [models.PointStruct(id=p.id, vector=p.dense or [], payload=p.payload)
                   for p in points]  # fmt: skip
    else:
        store._ensure_sparse()
        name = store._sparse_name
        structs = []
        for p in points:
            indices, values = p.sparse or ([], [])
            vector: models.VectorStruct = {
                SPARSE: models.SparseVector(indices=indices, values=values)
            }
            structs.append(models.PointStruct(id=p.id, vector=vector, payload=p.payload))
    store._create_field_indexes(name, mark_fields(points, integer=models.PayloadSchemaType.INTEGER))
    _client(functools.partial(store.client.upsert, name, points=structs, wait=True))
