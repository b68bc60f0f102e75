"""`webctx index export` / `import`: an embedded index moved to a Qdrant server (through
qdrant-client's local mode, the server's API) or another embedded store searches the same,
and bad input is refused with nothing written."""

from __future__ import annotations

import gzip
import json
import math
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from qdrant_client import QdrantClient

from tests.conftest import redis_url
from tests.factories import make_page
from tests.unit.test_index_store import TK
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.adapters.point_io import point_io
from webctx.adapters.qdrant_store import QdrantVectorStore
from webctx.errors import Conflict, InvalidRequest, ProviderUnavailable
from webctx.index.transfer import _index_keys, _raw_client, _read_key, export_index, import_index
from webctx.models import Chunk, Page
from webctx.protocols import IndexScope, IndexStore
from webctx.stages.store import make_points

pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
RNG = random.Random(5)
WORDS = [f"w{i}" for i in range(40)]
DIM = 32
QUERIES = [" ".join(RNG.sample(WORDS, 3)) for _ in range(6)]


def store_page(store: EdgeVectorStore, page: Page, lengths: list[int]) -> None:
    """Three chunks of random words under random unit vectors: no two hits tie on score
    (BM25 weighs a term by its count and the chunk's length: lengths differ across pages,
    or equal scores would rank in each store's own order)."""
    texts = [" ".join(RNG.choices(WORDS, k=lengths.pop())) for _ in range(3)]
    chunks = [Chunk(content_sha256=page.content_sha256, index=i, start=i, end=i + 1, text=t,
                    tokens=len(t.split())) for i, t in enumerate(texts)]  # fmt: skip
    points = make_points(chunks, [unit() for _ in chunks], url=page.url, model="m")
    store.upsert(points)
    store.upsert_sparse(points)


def unit() -> list[float]:
    v = [RNG.gauss(0, 1) for _ in range(DIM)]
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


QUERY_VECTORS = {q: unit() for q in QUERIES}


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def fill(store: EdgeVectorStore, r: redis.Redis) -> None:
    """Pages in both halves, two generations of marks, and the index's Redis keys."""
    pages = [make_page(url=f"https://s.test/{n}", text=n, title=n)
             for n in ("alpha", "beta", "gamma", "delta")]  # fmt: skip
    lengths = RNG.sample(range(4, 31), 3 * len(pages))
    for page in pages:
        store_page(store, page, lengths)
    live = {p.content_sha256: "s.test" for p in pages[:3]}
    store.mark_pages(tenant_key=TK, generation=1, live=live, dead=[])
    store.mark_pages(tenant_key=TK, generation=2, live={}, dead=[pages[2].content_sha256])
    r.hset("webctx:index:acme:pages", mapping={p.url: p.content_sha256 for p in pages})
    r.set("webctx:index:acme:gen", 2)
    raw = _raw_client(r)
    raw.set(f"webctx:index:page:{pages[0].content_sha256}", b"\x00\xff binary page text")
    raw.close()
    r.sadd(f"webctx:index:refs:{pages[0].content_sha256}", "acme https://s.test/alpha")
    r.zadd("webctx:index:graveyard", {pages[3].content_sha256: 1.5})
    r.hset("webctx:sources:acme", "s1", '{"source_id": "s1"}')
    r.zadd("webctx:sources:due", {"acme/s1": 123.0})
    r.set("webctx:index:lock:acme:s1", "scheduled", ex=60)  # a run's lock: not exported
    r.set("webctx:urlcache:x", "a page cache entry")  # not the index's


def snapshot(r: redis.Redis) -> dict[bytes, Any]:
    raw = _raw_client(r)
    try:
        return {k: _read_key(raw, k) for k in _index_keys(raw)}
    finally:
        raw.close()


def results(store: IndexStore) -> list[Any]:
    """Every query's dense and sparse ranks at both generations, and the hits' chunks."""
    out: list[Any] = []
    for generation in (1, 2):
        scope = IndexScope(TK, generation)
        for query in QUERIES:
            dense = store.rank_live(QUERY_VECTORS[query], limit=10, scope=scope)
            sparse = store.rank_live_sparse(query, limit=10, scope=scope)
            chunks = store.retrieve(dense + sparse)
            out.append((dense, sparse, {k: v.model_dump() for k, v in sorted(chunks.items())}))
    return out


@pytest.fixture
def exported(tmp_path: Path, r: redis.Redis) -> Iterator[tuple[Path, list[Any], dict[bytes, Any]]]:
    with EdgeVectorStore(tmp_path / "edge") as edge:
        fill(edge, r)
        counts = export_index(tmp_path / "index.gz", points=point_io(edge), client=r)
        assert counts == {"r": 7, "d": 12, "s": 12}
        yield tmp_path / "index.gz", results(edge), snapshot(r)


def test_an_embedded_index_imported_into_a_qdrant_server_searches_the_same(
    exported: tuple[Path, list[Any], dict[bytes, Any]], r: redis.Redis
) -> None:
    path, searched, keys = exported
    r.flushdb()
    server = QdrantVectorStore(QdrantClient(":memory:"), collection="moved")
    assert import_index(path, points=point_io(server), client=r, check=server.count)["d"] == 12
    assert results(server) == searched
    assert snapshot(r) == keys  # binary values and scores as they were
    assert not r.exists("webctx:index:lock:acme:s1")
    # Moving only the vectors (the same Redis): importing again changes nothing.
    import_index(path, points=point_io(server), client=r)
    assert results(server) == searched and server.count() == 12


def test_an_index_imported_into_another_embedded_store_searches_the_same(
    exported: tuple[Path, list[Any], dict[bytes, Any]], r: redis.Redis, tmp_path: Path
) -> None:
    path, searched, _ = exported
    with EdgeVectorStore(tmp_path / "other") as other:
        import_index(path, points=point_io(other), client=r)
        assert results(other) == searched


def empty_target() -> QdrantVectorStore:
    return QdrantVectorStore(QdrantClient(":memory:"), collection="target")


def test_a_truncated_export_is_refused_and_nothing_is_written(
    exported: tuple[Path, list[Any], dict[bytes, Any]], r: redis.Redis, tmp_path: Path
) -> None:
    path = exported[0]
    r.flushdb()
    cut = tmp_path / "cut.gz"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    target = empty_target()
    with pytest.raises(InvalidRequest, match="truncated"):
        import_index(cut, points=point_io(target), client=r)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    no_end = tmp_path / "no-end.gz"
    no_end.write_bytes(gzip.compress("\n".join(lines[:-1]).encode() + b"\n"))
    with pytest.raises(InvalidRequest, match="no end record"):
        import_index(no_end, points=point_io(target), client=r)
    assert target.count() == 0 and r.dbsize() == 0


def test_an_export_of_another_version_or_format_is_refused(r: redis.Redis, tmp_path: Path) -> None:
    later = tmp_path / "later.gz"
    later.write_bytes(gzip.compress(json.dumps({"format": "webctx-index", "version": 99}).encode()))
    target = empty_target()
    with pytest.raises(InvalidRequest, match="version 99"):
        import_index(later, points=point_io(target), client=r)
    other = tmp_path / "other.gz"
    other.write_bytes(b"plain text, not gzip")
    with pytest.raises(InvalidRequest, match="truncated or corrupt"):
        import_index(other, points=point_io(target), client=r)
    assert target.count() == 0 and r.dbsize() == 0


def test_an_import_over_another_index_in_redis_is_refused_and_nothing_is_written(
    exported: tuple[Path, list[Any], dict[bytes, Any]], r: redis.Redis
) -> None:
    path = exported[0]
    r.flushdb()
    r.set("webctx:index:acme:gen", 7)  # another index lives here
    target = empty_target()
    with pytest.raises(Conflict, match="webctx:index:acme:gen"):
        import_index(path, points=point_io(target), client=r)
    assert target.count() == 0 and r.keys("*") == ["webctx:index:acme:gen"]


def test_an_unreachable_server_fails_before_anything_is_written(
    exported: tuple[Path, list[Any], dict[bytes, Any]], r: redis.Redis
) -> None:
    path = exported[0]
    r.flushdb()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    client = QdrantClient(url=f"http://127.0.0.1:{port}", timeout=2, check_compatibility=False)
    server = QdrantVectorStore(client, collection="moved")
    with pytest.raises(ProviderUnavailable):
        import_index(path, points=point_io(server), client=r, check=server.count)
    assert r.dbsize() == 0


def test_an_export_that_cannot_be_written_leaves_no_file(r: redis.Redis, tmp_path: Path) -> None:
    with EdgeVectorStore(tmp_path / "edge") as edge:
        with pytest.raises(InvalidRequest, match="cannot write"):
            export_index(tmp_path / "missing" / "index.gz", points=point_io(edge), client=r)
    assert not (tmp_path / "missing").exists()
