"""The VectorStore contract (a research job's store and rank steps) on every backend, the
store stage's point ids, and what the Qdrant adapter and the datatype setting add."""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from qdrant_client import QdrantClient, models

from tests.store_points import MODEL, make_chunks, page_points, sha, unit
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.adapters.qdrant_store import QdrantVectorStore
from webctx.errors import ProviderError, ProviderUnavailable
from webctx.protocols import VectorStore
from webctx.stages.store import make_points, point_id, store_chunks, vector_lookup

ADAPTERS = ["memory", "edge", "qdrant-memory", "qdrant-path"]


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


def test_point_ids_are_exactly_the_uuid5_every_stored_point_was_keyed_by() -> None:
    # point_id computes uuid5 by hand; a single differing id would duplicate a page's
    # points in every store written before.
    import random
    import uuid

    from webctx.stages.store import POINT_NAMESPACE

    draw = random.Random(5)
    for model in (MODEL, "text-embedding-3-small", "modèle:ünïcode/1", ""):
        for _ in range(200):
            sha_ = f"{draw.getrandbits(256):064x}"
            start = draw.randrange(10**6)
            end = start + draw.randrange(1, 5000)
            expected = uuid.uuid5(POINT_NAMESPACE, f"{sha_}:{start}:{end}:{model}")
            assert point_id(sha_, start, end, model) == str(expected)


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


def test_qdrant_store_creates_its_collection_with_the_configured_datatype() -> None:
    client = QdrantClient(":memory:")
    store = QdrantVectorStore(client, collection="chunks", datatype="float16")
    store.upsert(page_points("a", [[1.0, 0.0, 0.0]]))
    params = client.get_collection("chunks").config.params.vectors
    assert isinstance(params, models.VectorParams)
    assert params.datatype == models.Datatype.FLOAT16
    client.close()


# --- the datatype setting --------------------------------------------------------------------


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
