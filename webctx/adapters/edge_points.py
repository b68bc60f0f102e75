"""Every point of an EdgeVectorStore, as stored, out and in (`webctx index export/import`).

Points go in by plain upsert (vectors and the whole payload, live marks included) under
their own ids, so importing the same file twice writes the same store; the payload
indexes searches filter on (content, site, each tenant's marks) are created first.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import qdrant_edge as qe

from webctx.adapters.edge_store import SPARSE, EdgeVectorStore, _create_field_indexes, _engine
from webctx.stages.store import RawPoint, mark_fields

PAGE = 512


def dump_points(store: EdgeVectorStore, half: str) -> Iterator[RawPoint]:
    """The dense or sparse half's points, a page of scroll at a time."""
    shard = store._current() if half == "dense" else store._sparse_shard(create=False)
    offset: qe.PointId | None = None
    while shard is not None:
        request = qe.ScrollRequest(offset=offset, limit=PAGE, with_payload=True, with_vector=True)
        records, offset = _engine(functools.partial(shard.scroll, request))
        for record in records:
            vector, payload = record.vector, dict(record.payload or {})
            if half == "dense":
                dense = vector.get("") if isinstance(vector, dict) else vector
                yield RawPoint(str(record.id), payload, dense=list(dense or []))  # type: ignore[arg-type]
            else:
                sv = vector.get(SPARSE) if isinstance(vector, dict) else None
                pair = (list(sv.indices), list(sv.values)) if sv else ([], [])  # type: ignore[union-attr]
                yield RawPoint(str(record.id), payload, sparse=pair)
        if offset is None:
            return


def load_points(store: EdgeVectorStore, half: str, points: Sequence[RawPoint]) -> None:
    """Upsert points into the dense or sparse half (created when absent), durable on return."""
    if not points:
        return
    if half == "dense":
        shard = store._current() or store._create_once(len(points[0].dense or []))
        batch = [qe.Point(p.id, p.dense, p.payload) for p in points]  # type: ignore[arg-type]
    else:
        created = store._sparse_shard(create=True)
        assert created is not None
        shard = created
        batch = [qe.Point(p.id, {SPARSE: qe.SparseVector(*(p.sparse or ([], [])))}, p.payload)
                 for p in points]  # fmt: skip
    _create_field_indexes(shard, mark_fields(points, integer=qe.PayloadSchemaType.Integer))
    _engine(functools.partial(shard.update, qe.UpdateOperation.upsert_points(batch)))
    _engine(shard.flush)
