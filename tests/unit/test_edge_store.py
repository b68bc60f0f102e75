"""The embedded engine's own behaviour: one process per path, durable writes, a bounded
write-ahead log, vector datatypes, threads, forks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import qdrant_edge as qe

from tests.store_points import MODEL, page_points, sha, unit
from webctx.adapters.edge_store import EdgeVectorStore, store_holder
from webctx.errors import ConfigError, ProviderError
from webctx.models import Chunk, StoredChunk
from webctx.protocols import IndexScope, VectorDatatype, VectorStore
from webctx.stages.store import make_points

REPO = Path(__file__).resolve().parents[2]


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
        assert store.retrieve([p.id for p in _named_page("cd")]) == {}  # dense and sparse
        ab = store.rank_live_sparse("ab text", limit=5, scope=IndexScope("t", generation=1))
        assert [p.chunk.text for p in store.retrieve(ab).values()] == ["ab text"]
        live = store.rank_live([1.0, 0.0], limit=5, scope=IndexScope("t", generation=1))
        assert [p.chunk.text for p in store.retrieve(live).values()] == ["ab text"]


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


def test_store_holder_names_the_process_holding_the_store(tmp_path: Path) -> None:
    assert store_holder(tmp_path / "q") is None  # never opened
    store = EdgeVectorStore(tmp_path / "q")
    try:
        assert store_holder(tmp_path / "q") == str(os.getpid())
    finally:
        store.close()
    assert store_holder(tmp_path / "q") is None
