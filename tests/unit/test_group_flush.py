"""One flush for many writes (webctx/jobs/group_flush.py): what waits for the flush runs only
after it, a write that arrives during a flush waits for the next one, and the timing rules
(quiet, at most a delay) hold; on a real qdrant-edge shard too."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from webctx.adapters.edge_store import EdgeVectorStore
from webctx.jobs.group_flush import GroupFlush
from webctx.models import Chunk, StoredChunk


class CountingStore:
    """Counts flushes; a flush can be held open to land writes in the middle of it."""

    def __init__(self) -> None:
        self.flushes = 0
        self.hold = threading.Event()
        self.hold.set()
        self.inside = threading.Event()
        self.fail = False

    def upsert_unflushed(self, points: object) -> None:
        raise AssertionError("not used here")

    def flush(self) -> None:
        self.inside.set()
        self.hold.wait(timeout=10)
        if self.fail:
            raise OSError("disk full")
        self.flushes += 1


@pytest.fixture
def store() -> CountingStore:
    return CountingStore()


@pytest.fixture
def flusher(store: CountingStore) -> Iterator[GroupFlush]:
    group = GroupFlush(store, quiet_s=0.05, max_delay_s=10.0)
    yield group
    group.close()


def _wait_for(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_what_waits_for_a_flush_runs_after_it_and_one_flush_serves_many(
    store: CountingStore, flusher: GroupFlush
) -> None:
    done: list[tuple[int, int]] = []
    for n in range(5):
        flusher.after_flush(lambda n=n: done.append((n, store.flushes)))
    _wait_for(lambda: len(done) == 5)
    assert done == [(n, 1) for n in range(5)]  # each after the one flush that served all
    assert store.flushes == 1


def test_a_write_during_a_flush_waits_for_the_next_one(
    store: CountingStore, flusher: GroupFlush
) -> None:
    done: list[str] = []
    store.hold.clear()
    flusher.after_flush(lambda: done.append("first"))
    assert store.inside.wait(timeout=5)  # the first flush has started...
    flusher.after_flush(lambda: done.append("second"))  # ...before this write was made
    store.hold.set()
    _wait_for(lambda: done == ["first", "second"])
    assert store.flushes == 2


def test_writes_that_never_pause_are_flushed_after_the_longest_delay(store: CountingStore) -> None:
    group = GroupFlush(store, quiet_s=5.0, max_delay_s=0.2)
    try:
        done: list[float] = []
        started = time.monotonic()
        while not done:  # a write every 20 ms: never quiet for 5 s
            group.after_flush(lambda: done.append(time.monotonic()))
            assert time.monotonic() - started < 5, "never flushed"
            time.sleep(0.02)
        assert done[0] - started >= 0.2
    finally:
        group.close()


def test_nothing_is_flushed_while_writes_keep_coming_within_the_quiet_time(
    store: CountingStore,
) -> None:
    group = GroupFlush(store, quiet_s=0.3, max_delay_s=10.0)
    try:
        for _ in range(10):
            group.after_flush(lambda: None)
            time.sleep(0.05)
        assert store.flushes == 0 and group.pending() == 10
        _wait_for(lambda: group.pending() == 0)
        assert store.flushes == 1
    finally:
        group.close()


def test_a_failed_flush_runs_nothing_that_waited_for_it(
    store: CountingStore, flusher: GroupFlush, caplog: pytest.LogCaptureFixture
) -> None:
    store.fail = True
    done: list[int] = []
    flusher.after_flush(lambda: done.append(1))
    _wait_for(lambda: flusher.pending() == 0)
    time.sleep(0.05)
    assert done == [] and "vector store flush failed" in caplog.text


def test_closing_flushes_what_waits_and_a_later_write_is_flushed_at_once(
    store: CountingStore,
) -> None:
    group = GroupFlush(store, quiet_s=60.0, max_delay_s=60.0)
    done: list[int] = []
    group.after_flush(lambda: done.append(1))
    group.close()
    assert done == [1] and store.flushes == 1
    group.after_flush(lambda: done.append(2))  # a store task racing the worker's shutdown
    assert done == [1, 2] and store.flushes == 2


def _point(i: int) -> StoredChunk:
    chunk = Chunk(content_sha256="a" * 64, index=i, start=i * 10, end=i * 10 + 10,
                  text=f"chunk {i}", tokens=2)  # fmt: skip
    vector = [1.0 if d == i % 4 else 0.0 for d in range(4)]
    return StoredChunk(id=f"00000000-0000-0000-0000-{i:012d}", vector=vector, chunk=chunk,
                       url="https://example.org/a", model="m")  # fmt: skip


def test_an_unflushed_write_is_searchable_at_once_and_durable_after_the_flush(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q"
    with EdgeVectorStore(path) as edge:
        edge.upsert_unflushed([_point(i) for i in range(3)])
        hits = edge.search([1.0, 0.0, 0.0, 0.0], limit=3, content_sha256s=["a" * 64])
        assert [h.chunk.index for h in hits][0] == 0  # searchable before any flush
        group = GroupFlush(edge, quiet_s=0.01)
        flushed = threading.Event()
        group.after_flush(flushed.set)
        assert flushed.wait(timeout=5)
        group.close()
    with EdgeVectorStore(path) as reopened:
        assert reopened.count() == 3
