"""How the embedded engine's shards are laid out and searched: HNSW, segment sizes,
quantization, and the per-query search parameters that go with them.

A `Tuning` is fixed when a shard is created: a shard written by an earlier webctx opens
with the layout it was created with (the engine's defaults), and takes this one through
`webctx index export` and `import` into a new directory.
"""

from __future__ import annotations

from dataclasses import dataclass

import qdrant_edge as qe


@dataclass(frozen=True)
class Tuning:
    """The shard layout and search parameters of an EdgeVectorStore."""

    max_segment_kb: int | None = 256_000
    """Largest segment the optimizers build (KB of vectors): graphs are built per segment,
    so a bounded segment keeps each `optimize()` (which holds the GIL) bounded too."""
    segments: int | None = None
    """Segments the optimizers keep before they merge; None: the engine's default (one per
    CPU). 8 on 2 cores cost as much optimizing at 100,000 points and doubled the search's
    p95 (more graphs per query)."""
    indexing_threshold_kb: int | None = 10_000
    """A segment past this many KB of vectors gets an HNSW graph at the next optimize."""
    hnsw_m: int = 16
    hnsw_ef_construct: int = 100
    payload_graphs: bool = False
    """Extra HNSW links per payload-index value (`payload_m`): the engine's default builds
    them for every indexed field (page hash, site, each tenant's marks), more graph work in
    every optimize; our filters (a tenant's marks, ~all points; a site, a MatchAny of pages)
    search well without them (recall@10 0.99 at 100,000 points, docs/benchmarks.md)."""
    quantization: bool = False
    """int8 scalar quantization of the dense vectors in RAM, originals on disk for
    rescoring: half the float16 vectors' memory, and half again their disk (off: the disk
    per chunk is the scarcer)."""
    oversampling: float = 2.0
    hnsw_ef: int | None = 128
    engine_defaults: bool = False
    """Pass nothing: the engine's own defaults (how shards were created before)."""

    def vector_params(
        self, dimensions: int, datatype: qe.VectorStorageDatatype
    ) -> qe.EdgeVectorParams:
        """The dense vector's parameters for a new shard."""
        return qe.EdgeVectorParams(
            size=dimensions,
            distance=qe.Distance.Cosine,
            datatype=datatype,
            memory=qe.Memory.Cold if self.quantization else None,
        )

    def config(self, vectors: qe.EdgeVectorParams) -> qe.EdgeConfig:
        """The config of a new dense shard."""
        wal = False
        if self.engine_defaults:
            return qe.EdgeConfig(vectors=vectors, wal_enabled=wal)
        hnsw = qe.HnswIndexConfig(
            m=self.hnsw_m,
            ef_construct=self.hnsw_ef_construct,
            full_scan_threshold=10_000,
            payload_m=None if self.payload_graphs else 0,
        )
        optimizers = qe.EdgeOptimizersConfig(
            default_segment_number=self.segments,
            max_segment_size=self.max_segment_kb,
            indexing_threshold=self.indexing_threshold_kb,
        )
        quantization = (
            qe.ScalarQuantizationConfig(qe.ScalarType.Int8, quantile=0.99, memory=qe.Memory.Pinned)
            if self.quantization
            else None
        )
        return qe.EdgeConfig(
            vectors=vectors,
            hnsw_config=hnsw,
            quantization_config=quantization,
            optimizers=optimizers,
            wal_enabled=wal,
        )

    def search_params(self) -> qe.SearchParams:
        """Per-query parameters: the graph's ef, rescoring of the quantized candidates."""
        if self.engine_defaults:
            return qe.SearchParams()
        quantization = (
            qe.QuantizationSearchParams(rescore=True, oversampling=self.oversampling)
            if self.quantization
            else None
        )
        return qe.SearchParams(hnsw_ef=self.hnsw_ef, quantization=quantization)


UNTUNED = Tuning(quantization=False, engine_defaults=True)
"""The engine's defaults, as webctx created shards before: the baseline of the benchmarks."""
