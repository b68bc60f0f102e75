"""Move a persistent index between vector stores (`webctx index export` / `import`): the
embedded engine to a Qdrant server, or one machine to another.

An export file is gzip'd JSON lines, written to `<path>.partial` and renamed when whole:

    {"format": "webctx-index", "version": 1, "created_at": ...}     the header
    {"t": "r", "k": key, "type": "hash", "v": ..., "ttl_ms": null}  one Redis key
    {"t": "d", "id": ..., "v": base64 float32, "p": payload}        one dense point
    {"t": "s", "id": ..., "i": [...], "x": base64 float32, "p": ...} one sparse point
    {"t": "end", "r": n, "d": n, "s": n}                             the counts, last

Redis keys (binary-safe, base64) come first: the index's page records, generations, page
texts, references and graveyard (`webctx:index:*`, not the run locks and run records) and
the source registry with its schedule (`webctx:sources:*`, not the due claims). The
points follow, ids and payloads (every tenant's live marks) as stored, so searches see the
same pages at the same generation after an import.

An import reads the whole file once before it writes anything: a truncated or corrupt
file, another format or version, or a Redis that already holds other values under the
same keys (another index) is refused with nothing written. Points are then upserted by
id (an import run twice writes the same store), and last the Redis keys that are absent.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import redis

from webctx.errors import Conflict, InvalidRequest
from webctx.keys import INDEX_GLOBS
from webctx.stages.store import RawPoint

FORMAT, VERSION = "webctx-index", 1
HALVES = ("dense", "sparse")
_PATTERNS = INDEX_GLOBS
_TRANSIENT = (b"webctx:index:lock:", b"webctx:index:run:", b"webctx:sources:claim:")
BATCH = 256


class PointIO(Protocol):
    """A vector store's points, out and in, by half ("dense", "sparse")."""

    def dump(self, half: str) -> Iterator[RawPoint]: ...
    def load(self, half: str, points: Sequence[RawPoint]) -> None: ...


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _floats(values: Sequence[float]) -> str:
    return _b64(np.asarray(values, dtype="<f4").tobytes())


def _unfloats(text: str) -> list[float]:
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(float).tolist()  # type: ignore[no-any-return]


def _raw_client(client: redis.Redis) -> redis.Redis:
    """The same Redis, without decoding (page texts and records go through as bytes)."""
    kwargs = dict(client.connection_pool.connection_kwargs)
    kwargs["decode_responses"] = False
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=client.connection_pool.connection_class, **kwargs))  # fmt: skip


def _read_key(client: redis.Redis, key: bytes) -> dict[str, Any] | None:
    r: Any = client  # a bytes client: its replies are bytes
    kind = r.type(key).decode()
    value: Any
    if kind == "string":
        value = _b64(r.get(key))
    elif kind == "hash":
        value = {_b64(k): _b64(v) for k, v in r.hgetall(key).items()}
    elif kind == "set":
        value = sorted(_b64(m) for m in r.smembers(key))
    elif kind == "zset":
        value = [[_b64(m), s] for m, s in r.zrange(key, 0, -1, withscores=True)]
    elif kind == "list":
        value = [_b64(m) for m in r.lrange(key, 0, -1)]
    else:
        return None  # gone meanwhile
    ttl = int(r.pttl(key))
    return {"t": "r", "k": _b64(key), "type": kind, "v": value, "ttl_ms": ttl if ttl > 0 else None}


def _index_keys(r: redis.Redis) -> list[bytes]:
    keys = {k for pattern in _PATTERNS for k in r.scan_iter(match=pattern, count=1000)}
    return sorted(k for k in keys if not k.startswith(_TRANSIENT))


def export_index(path: Path, *, points: PointIO, client: redis.Redis) -> dict[str, int]:
    """Write the index (Redis keys, then points) to `path`; the counts written."""
    r = _raw_client(client)
    partial = path.with_name(path.name + ".partial")
    counts = {"r": 0, "d": 0, "s": 0}
    try:
        with gzip.open(partial, "wt", compresslevel=1, encoding="utf-8") as out:
            out.write(json.dumps({"format": FORMAT, "version": VERSION,
                                  "created_at": time.time()}) + "\n")  # fmt: skip
            for key in _index_keys(r):
                record = _read_key(r, key)
                if record is not None:
                    out.write(json.dumps(record) + "\n")
                    counts["r"] += 1
            for half in HALVES:
                for p in points.dump(half):
                    out.write(json.dumps(_point_line(half, p)) + "\n")
                    counts[half[0]] += 1
            out.write(json.dumps({"t": "end", **counts}) + "\n")
        os.replace(partial, path)
    except OSError as exc:
        raise InvalidRequest(f"cannot write {path}: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
        r.close()
    return counts


def _point_line(half: str, p: RawPoint) -> dict[str, Any]:
    if half == "dense":
        return {"t": "d", "id": p.id, "v": _floats(p.dense or []), "p": p.payload}
    indices, values = p.sparse or ([], [])
    return {"t": "s", "id": p.id, "i": indices, "x": _floats(values), "p": p.payload}


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The file's records after a checked header, with line numbers; InvalidRequest for
    another format or version, a corrupt or truncated file."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as src:
            header = _parse(src.readline(), 1)
            if header.get("format") != FORMAT:
                raise InvalidRequest(f"{path} is not a webctx index export")
            if header.get("version") != VERSION:
                raise InvalidRequest(f"{path} is a version {header.get('version')!r} index "
                                     f"export; this webctx reads version {VERSION}")  # fmt: skip
            for number, line in enumerate(src, start=2):
                yield number, _parse(line, number)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{path} cannot be read ({exc}): truncated or corrupt") from exc


def _parse(line: str, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise InvalidRequest(f"index export line {number}: not a JSON object (truncated?)")
    return record


def _check(path: Path, r: redis.Redis) -> dict[str, int]:
    """Read the whole file: its counts, or InvalidRequest / Conflict with nothing written."""
    counts, end = {"r": 0, "d": 0, "s": 0}, None
    for number, record in _lines(path):
        kind = record.get("t")
        if end is not None:
            raise InvalidRequest(f"index export line {number}: data after the end record")
        if kind == "end":
            end = record
        elif kind in counts:
            counts[kind] += 1
            if kind == "r":
                _check_key(r, record)
        else:
            raise InvalidRequest(f"index export line {number}: unknown record type {kind!r}")
    if end is None:
        raise InvalidRequest(f"{path} has no end record: truncated (an export cut short)")
    if {k: end.get(k) for k in counts} != counts:
        raise InvalidRequest(f"{path}: the end record's counts do not match its records")
    return counts


def _check_key(r: redis.Redis, record: dict[str, Any]) -> None:
    key = base64.b64decode(record["k"])
    here = _read_key(r, key) if r.exists(key) else None
    if here is not None and (here["type"], here["v"]) != (record["type"], record["v"]):
        raise Conflict(f"the target Redis already holds {key.decode(errors='replace')} "
                       "with other contents (another index): import into an empty one")  # fmt: skip


def import_index(
    path: Path,
    *,
    points: PointIO,
    client: redis.Redis,
    check: Callable[[], object] | None = None,
) -> dict[str, int]:
    """Load an export into the store and Redis; the counts read. Nothing is written unless
    the whole file reads back and fits (see the module docstring). `check` is called
    first: a store that is unreachable fails there, before the file is read."""
    if check is not None:
        check()
    r = _raw_client(client)
    try:
        counts = _check(path, r)
        batch: list[RawPoint] = []
        half = "dense"
        for _, record in _lines(path):
            kind = record["t"]
            if kind in ("d", "s"):
                if batch and (kind == "d") != (half == "dense") or len(batch) >= BATCH:
                    points.load(half, batch)
                    batch = []
                half = "dense" if kind == "d" else "sparse"
                batch.append(_raw_point(record))
        points.load(half, batch)
        for _, record in _lines(path):
            if record["t"] == "r":
                _restore(r, record)
    finally:
        r.close()
    return counts


def _raw_point(record: dict[str, Any]) -> RawPoint:
    if record["t"] == "d":
        return RawPoint(record["id"], record["p"], dense=_unfloats(record["v"]))
    return RawPoint(record["id"], record["p"], sparse=(record["i"], _unfloats(record["x"])))


def _restore(r: redis.Redis, record: dict[str, Any]) -> None:
    key, value, kind = base64.b64decode(record["k"]), record["v"], record["type"]
    if r.exists(key):
        return  # the same contents (checked): the index moves to another store, same Redis
    d = base64.b64decode
    pipe = r.pipeline()
    if kind == "string":
        pipe.set(key, d(value))
    elif kind == "hash":
        pipe.hset(key, mapping={d(k): d(v) for k, v in value.items()})
    elif kind == "set":
        pipe.sadd(key, *(d(m) for m in value))
    elif kind == "zset":
        pipe.zadd(key, {d(m): float(s) for m, s in value})
    elif kind == "list":
        pipe.rpush(key, *(d(m) for m in value))
    if record.get("ttl_ms"):
        pipe.pexpire(key, int(record["ttl_ms"]))
    pipe.execute()
