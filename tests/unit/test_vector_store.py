"""One contract for every VectorStore adapter, plus the store stage and edge-only behaviour."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import qdrant_edge as qe
from qdrant_client import QdrantClient, models

from webctx.adapters.edge_store import EdgeVectorStore
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.adapters.qdrant_store import QdrantVectorStore
from webctx.errors import ConfigError, ProviderError, ProviderUnavailable
from webctx.models import Chunk, StoredChunk
from webctx.protocols import IndexScope, VectorDatatype, VectorStore
from webctx.stages.store import make_points, point_id, store_chunks, vector_lookup

REPO = Path(__file__).resolve().parents[2]
MODEL = "test-embedding"
ADAPTERS = ["memory", "edge", "qdrant-memory", "qdrant-path"]


def sha(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def make_chunks(page: str, n: int) -> list[Chunk]:
    return [
        Chunk(
            content_sha256=sha(page),
            index=i,
            start=i * 10,
            end=i * 10 + 10,
            text=f"{page} chunk {i} – ünïcode",
            tokens=3,
        )
        for i in range(n)
    ]


def page_points(page: str, vectors: Sequence[Sequence[float]]) -> list[StoredChunk]:
    return make_points(
        make_chunks(page, len(vectors)), vectors, url=f"https://{page}.test/", model=MODEL
    )


def unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


@pytest.fixture(params=ADAPTERS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    kind: str = request.param
    if kind == "memory":
        yield MemoryVectorStore()
    elif kind == "edge":
        edge = EdgeVectorStore(tmp_path / "edge")
        yield edge
        edge.close()
    else:
        client = (
            QdrantClient(path=str(tmp_path / "local"))
            if kind == "qdrant-path"
            else QdrantClient(":memory:")
        )
        yield QdrantVectorStore(client, collection="chunks")
        client.close()


# Qdrant's local mode warns that payload indexes are no-ops there; servers use them.
pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")


def test_empty_store_counts_zero_and_finds_nothing(store: VectorStore) -> None:
    assert store.count() == 0
    assert store.search([1.0, 0.0, 0.0], limit=5, content_sha256s=[sha("a")]) == []


def test_search_orders_by_cosine_similarity(store: VectorStore) -> None:
    store.upsert(page_points("a", [[0.0, 1.0, 0.0], [5.0, 0.1, 0.0], [1.0, 1.0, 0.0]]))
    hits = store.search([2.0, 0.0, 0.0], limit=3, content_sha256s=[sha("a")])
    assert [h.chunk.index for h in hits] == [1, 2, 0]
    assert hits[0].score == pytest.approx(5.0 / math.hypot(5.0, 0.1), abs=1e-5)
    assert hits[1].score == pytest.approx(math.sqrt(0.5), abs=1e-5)
    assert hits[2].score == pytest.approx(0.0, abs=1e-5)


def test_search_returns_at_most_limit(store: VectorStore) -> None:
    store.upsert(page_points("a", [[1.0, float(i), 0.0] for i in range(6)]))
    hits = store.search([1.0, 0.0, 0.0], limit=2, content_sha256s=[sha("a")])
    assert [h.chunk.index for h in hits] == [0, 1]


def test_search_only_returns_chunks_of_the_given_pages(store: VectorStore) -> None:
    store.upsert(page_points("a", [[1.0, 0.0, 0.0]]))
    store.upsert(page_points("b", [[0.9, 0.1, 0.0], [0.0, 1.0, 0.0]]))
    store.upsert(page_points("c", [[1.0, 0.0, 0.0]]))
    hits = store.search([1.0, 0.0, 0.0], limit=10, content_sha256s=[sha("b"), sha("c")])
    assert sorted(h.chunk.content_sha256 for h in hits) == sorted([sha("b"), sha("b"), sha("c")])
    assert store.search([1.0, 0.0, 0.0], limit=10, content_sha256s=[]) == []
    assert store.search([1.0, 0.0, 0.0], limit=10, content_sha256s=[sha("zzz")]) == []


def test_reupserting_the_same_chunks_adds_no_point(store: VectorStore) -> None:
    vectors = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    store.upsert(page_points("a", vectors))
    store.upsert(page_points("a", vectors))  # a retried task rebuilds the same points
    assert store.count() == 2
    assert len(store.search([1.0, 0.0, 0.0], limit=10, content_sha256s=[sha("a")])) == 2


def test_upsert_overwrites_a_point_by_id(store: VectorStore) -> None:
    store.upsert(page_points("a", [[1.0, 0.0, 0.0]]))
    store.upsert(page_points("a", [[0.0, 0.0, 1.0]]))
    (hit,) = store.search([0.0, 0.0, 1.0], limit=5, content_sha256s=[sha("a")])
    assert hit.score == pytest.approx(1.0, abs=1e-5)
    assert store.count() == 1


def test_payload_and_vector_round_trip(store: VectorStore) -> None:
    points = page_points("a", [[3.0, 4.0, 0.0]])
    store.upsert(points)
    (hit,) = store.search([3.0, 4.0, 0.0], limit=1, content_sha256s=[sha("a")])
    assert hit.chunk == points[0].chunk
    assert hit.url == "https://a.test/"
    # Cosine stores are normalised, as Qdrant does: the vector comes back with length 1.
    assert hit.vector == pytest.approx(unit([3.0, 4.0, 0.0]), abs=1e-6)


def test_search_without_vectors_finds_the_same_hits_with_empty_vectors(
    store: VectorStore,
) -> None:
    store.upsert(page_points("a", [[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 0.0, 1.0]]))
    query, pages = [1.0, 0.1, 0.0], [sha("a")]
    full = store.search(query, limit=3, content_sha256s=pages)
    bare = store.search(query, limit=3, content_sha256s=pages, with_vectors=False)
    assert [(h.chunk, h.url) for h in bare] == [(h.chunk, h.url) for h in full]
    assert [h.score for h in bare] == pytest.approx([h.score for h in full])
    assert all(h.vector == [] for h in bare) and all(h.vector for h in full)


def test_vectors_by_point_id_are_the_stored_ones_and_skip_unknown_ids(
    store: VectorStore,
) -> None:
    assert store.vectors([point_id(sha("a"), 0, 10, MODEL)]) == {}  # nothing stored yet
    points = page_points("a", [[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]])
    store.upsert(points)
    missing = point_id(sha("b"), 0, 10, MODEL)
    found = store.vectors([points[1].id, missing, points[0].id])
    assert set(found) == {points[0].id, points[1].id}
    assert found[points[0].id] == pytest.approx(unit([3.0, 4.0, 0.0]), abs=1e-6)
    assert found[points[1].id] == pytest.approx([0.0, 0.0, 1.0], abs=1e-6)
    (hit,) = store.search([3.0, 4.0, 0.0], limit=1, content_sha256s=[sha("a")])
    assert vector_lookup(store, MODEL)([hit]) == [pytest.approx(hit.vector, abs=1e-6)]


def test_dimension_is_learned_at_first_upsert(store: VectorStore) -> None:
    store.upsert(page_points("a", [[0.1] * 7]))
    assert store.search([0.1] * 7, limit=1, content_sha256s=[sha("a")])[0].score == pytest.approx(
        1.0, abs=1e-5
    )
    with pytest.raises(ProviderError):
        store.upsert(page_points("b", [[0.1] * 5]))


def test_store_chunks_writes_in_batches(store: VectorStore) -> None:
    points = page_points("a", [[1.0, float(i), 0.0] for i in range(7)])
    assert store_chunks(store, points, batch_size=3) == 7
    assert store.count() == 7


# --- the store stage -------------------------------------------------------------------------


def test_point_id_is_a_stable_uuid5_of_content_offsets_and_model() -> None:
    first = point_id(sha("a"), 0, 10, MODEL)
    assert first == point_id(sha("a"), 0, 10, MODEL)
    assert first[14] == "5"  # UUID version nibble
    others = {
        point_id(sha("b"), 0, 10, MODEL),
        point_id(sha("a"), 0, 11, MODEL),
        point_id(sha("a"), 1, 10, MODEL),
        point_id(sha("a"), 0, 10, "other-model"),
    }
    assert first not in others and len(others) == 4


def test_make_points_refuses_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="2 chunks but 1 vectors"):
        make_points(make_chunks("a", 2), [[1.0]], url="https://a.test/", model=MODEL)


# --- qdrant-client specifics -----------------------------------------------------------------


def test_qdrant_store_reports_an_unreachable_server_as_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = QdrantClient(url=f"http://127.0.0.1:{port}", timeout=2, check_compatibility=False)
    store = QdrantVectorStore(client, collection="chunks")
    with pytest.raises(ProviderUnavailable):
        store.upsert(page_points("a", [[1.0, 0.0]]))
    with pytest.raises(ProviderUnavailable):
        store.count()


# --- qdrant-edge specifics -------------------------------------------------------------------

OPEN_IN_CHILD = """
import sys
from pathlib import Path
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.errors import ConfigError
try:
    store = EdgeVectorStore(Path(sys.argv[1]))
except ConfigError as exc:
    print(exc)
    sys.exit(3)
print(store.count())
store.close()
"""


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_edge_store_refuses_a_path_held_by_another_process(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path)
    store.upsert(page_points("a", [[1.0, 0.0]]))
    held = run_child(OPEN_IN_CHILD, str(tmp_path))
    assert held.returncode == 3, held.stderr
    assert "is in use by another process" in held.stdout
    assert "WEBCTX_QDRANT_URL" in held.stdout
    store.close()
    freed = run_child(OPEN_IN_CHILD, str(tmp_path))
    assert (freed.returncode, freed.stdout.strip()) == (0, "1"), freed.stderr


def test_edge_store_refuses_a_second_opener_in_the_same_process(tmp_path: Path) -> None:
    with EdgeVectorStore(tmp_path), pytest.raises(ConfigError, match="in use"):
        EdgeVectorStore(tmp_path)


def test_edge_store_keeps_points_across_close_and_reopen(tmp_path: Path) -> None:
    points = page_points("a", [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    with EdgeVectorStore(tmp_path) as store:
        store.upsert(points)
    with EdgeVectorStore(tmp_path) as store:
        assert store.count() == 2
        hits = store.search([0.0, 1.0, 0.0], limit=1, content_sha256s=[sha("a")])
        assert hits[0].chunk == points[1].chunk  # the payload index came back too
        with pytest.raises(ProviderError):  # the dimension persisted with the shard
            store.upsert(page_points("b", [[1.0, 0.0]]))


WRITE_THEN_DIE = """
import os, signal, sys
from pathlib import Path
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.stages.store import make_points
from webctx.models import Chunk
store = EdgeVectorStore(Path(sys.argv[1]))
def page(name):
    chunk = Chunk(content_sha256=name * 32, index=0, start=0, end=5, text=f"{name} text",
                  tokens=2)
    return make_points([chunk], [[1.0, 0.0]], url=f"https://{name}.test/", model="m")
store.upsert(page("ab"))
store.upsert(page("cd"))
store.upsert_sparse(page("ab") + page("cd"))
store.mark_pages(tenant_key="t", generation=1, live={"ab" * 32: "ab.test"}, dead=[])
store.delete_pages(["cd" * 32])
store.upsert(page("ef"))
os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush at exit
"""


def _create_logged_shard(path: Path) -> None:
    """A shard as webctx created them before it turned the engine's write-ahead log off."""
    params = qe.EdgeVectorParams(size=2, distance=qe.Distance.Cosine)
    qe.EdgeShard.create(str(path), qe.EdgeConfig(vectors=params)).close()
    sparse = {"bm25": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)}
    sparse_path = path.with_name(path.name + ".sparse")
    qe.EdgeShard.create(str(sparse_path), qe.EdgeConfig(sparse_vectors=sparse)).close()


@pytest.mark.parametrize("shard", ["new", "logged"])
def test_edge_store_keeps_every_returned_write_after_a_crash(tmp_path: Path, shard: str) -> None:
    # A new shard has no log: each write must be flushed before it returns.
    path = tmp_path / "chunks"
    if shard == "logged":
        _create_logged_shard(path)
    died = run_child(WRITE_THEN_DIE, str(path))
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert (path / "wal").exists() == (shard == "logged")
    with EdgeVectorStore(path) as store:
        assert store.count() == 2
        kept = [p.id for p in _named_page("ab") + _named_page("ef")]
        assert set(store.retrieve(kept)) == set(kept)
        assert store.search_sparse("cd text", limit=5, content_sha256s=["cd" * 32]) == []
        ab = store.search_sparse("ab text", limit=5, content_sha256s=["ab" * 32])
        assert [hit.chunk.text for hit in ab] == ["ab text"]
        live = store.search_live([1.0, 0.0], limit=5, scope=IndexScope("t", generation=1))
        assert [hit.chunk.text for hit in live] == ["ab text"]


def _named_page(name: str) -> list[StoredChunk]:
    chunk = Chunk(content_sha256=name * 32, index=0, start=0, end=5, text=f"{name} text",
                  tokens=2)  # fmt: skip
    return make_points([chunk], [[1.0, 0.0]], url=f"https://{name}.test/", model="m")


def _stored_vector(store: VectorStore, point: StoredChunk) -> np.ndarray:
    return np.asarray(store.vectors([point.id])[point.id])


@pytest.mark.parametrize("datatype", ["float32", "float16"])
def test_edge_store_keeps_vectors_in_the_configured_datatype(
    tmp_path: Path, datatype: VectorDatatype
) -> None:
    vector = unit([0.1, 0.2, 0.3, 0.4])
    (point,) = page_points("a", [vector])
    with EdgeVectorStore(tmp_path, datatype=datatype) as store:
        store.upsert([point])
        stored = _stored_vector(store, point)
        hits = store.search([0.1, 0.2, 0.3, 0.4], limit=1, content_sha256s=[sha("a")])
    # The engine keeps exactly the vector rounded to the type: float16 keeps ~3 digits.
    expected = np.asarray(vector, dtype=np.dtype(datatype)).astype(np.float64)
    assert stored.tolist() == pytest.approx(expected.tolist(), abs=1e-7)
    assert (stored != np.asarray(vector, np.float32)).any() == (datatype == "float16")
    assert hits[0].score == pytest.approx(1.0, abs=1e-3)


def test_edge_store_reopened_keeps_the_datatype_it_was_created_with(tmp_path: Path) -> None:
    vector = unit([0.1, 0.2, 0.3, 0.4])
    (point,) = page_points("a", [vector])
    with EdgeVectorStore(tmp_path, datatype="float32") as store:
        store.upsert([point])
    with EdgeVectorStore(tmp_path, datatype="float16") as store:
        (second,) = page_points("b", [vector])
        store.upsert([second])
        # Both points float32: the setting shapes new shards, not existing ones.
        assert _stored_vector(store, second).tolist() == pytest.approx(vector, abs=1e-7)
        assert (_stored_vector(store, second) == np.asarray(vector, np.float32)).all()


def test_qdrant_store_creates_its_collection_with_the_configured_datatype() -> None:
    client = QdrantClient(":memory:")
    store = QdrantVectorStore(client, collection="chunks", datatype="float16")
    store.upsert(page_points("a", [[1.0, 0.0, 0.0]]))
    params = client.get_collection("chunks").config.params.vectors
    assert isinstance(params, models.VectorParams)
    assert params.datatype == models.Datatype.FLOAT16
    client.close()


def _fill_write_ahead_log(
    store: EdgeVectorStore, megabytes: int, *, sparse: bool = False
) -> None:
    """Upsert points whose payloads add up to `megabytes` (the log holds each one)."""
    write = store.upsert_sparse if sparse else store.upsert
    text = "x" * 8000
    per_page = 100
    for page in range(megabytes * 2**20 // (len(text) * per_page) + 1):
        chunks = [Chunk(content_sha256=sha(f"p{page}"), index=i, start=i, end=i + len(text),
                        text=text, tokens=1) for i in range(per_page)]  # fmt: skip
        write(make_points(chunks, [[1.0, float(i)] for i in range(per_page)],
                          url="https://a.test/", model=MODEL))  # fmt: skip


@pytest.mark.parametrize("shard", ["chunks", "chunks.sparse"])
def test_edge_store_keeps_the_write_ahead_log_of_a_logged_shard_bounded(
    tmp_path: Path, shard: str
) -> None:
    # The engine's log rolls over to a new 32 MB segment when one fills, and drops closed
    # ones at a flush. 100 MB of updates fill three segments.
    _create_logged_shard(tmp_path / "chunks")
    with EdgeVectorStore(tmp_path / "chunks") as store:
        _fill_write_ahead_log(store, 100, sparse=shard.endswith("sparse"))
        wal = tmp_path / shard / "wal"
        closed = [f.name for f in wal.iterdir() if f.name.startswith("closed-")]
        assert len(closed) <= 1, closed


def test_edge_store_creates_shards_without_a_write_ahead_log(tmp_path: Path) -> None:
    # A log would write every update twice and keep its open 32 MB segment in memory.
    with EdgeVectorStore(tmp_path / "chunks") as store:
        _fill_write_ahead_log(store, 40)
        store.upsert_sparse(page_points("a", [[1.0, 0.0]]))
        logs = [p for p in tmp_path.rglob("*") if p.name == "wal"]
        assert logs == []
        assert store.count() > 4_000


def test_edge_store_created_with_dimensions_refuses_other_sizes(tmp_path: Path) -> None:
    with EdgeVectorStore(tmp_path, dimensions=4) as store:
        assert store.count() == 0
        with pytest.raises(ProviderError, match="dim"):
            store.upsert(page_points("a", [[1.0, 0.0]]))


def test_edge_store_is_safe_for_many_threads(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for batch in range(10):
                page = f"w{worker}-{batch}"
                edge.upsert(page_points(page, [[1.0, float(worker), float(i)] for i in range(5)]))
                assert len(edge.search([1.0, 0.0, 0.0], limit=3, content_sha256s=[sha(page)])) == 3
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with EdgeVectorStore(tmp_path) as edge:
        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert edge.count() == 8 * 10 * 5


def test_edge_store_refuses_use_after_close(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path)
    store.close()
    store.close()  # idempotent
    with pytest.raises(ProviderError, match="closed"):
        store.count()


def test_edge_store_refuses_use_in_a_forked_child(tmp_path: Path) -> None:
    with EdgeVectorStore(tmp_path) as store:
        pid = os.fork()
        if pid == 0:  # the child shares the parent's lock and engine: it must not write
            try:
                store.count()
            except ConfigError:
                os._exit(3)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 3
        assert store.count() == 0  # the parent still works


@pytest.mark.parametrize(("env", "stored"), [(None, "float16"), ("float32", "float32")])
def test_datatype_setting_shapes_the_embedded_shard_build_store_creates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, stored: str
) -> None:
    from webctx.settings import Settings
    from webctx.workers.deps import build_store

    if env is None:
        monkeypatch.delenv("WEBCTX_QDRANT_VECTOR_DATATYPE", raising=False)
    else:
        monkeypatch.setenv("WEBCTX_QDRANT_VECTOR_DATATYPE", env)
    store = build_store(Settings(qdrant_path=tmp_path / "q"))
    assert isinstance(store, EdgeVectorStore)
    with store:
        store.upsert(page_points("a", [[1.0, 0.0, 0.0]]))
    config = json.loads((tmp_path / "q" / "edge_config.json").read_text())
    assert config["vectors"][""]["datatype"] == stored


def test_an_unknown_datatype_is_refused_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    from webctx.settings import Settings

    monkeypatch.setenv("WEBCTX_QDRANT_VECTOR_DATATYPE", "int8")
    with pytest.raises(ValidationError, match="'float32' or 'float16'"):
        Settings()
