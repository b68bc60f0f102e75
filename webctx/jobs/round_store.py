"""The rounds of a `depth=deep` job in the job store: what each further round asked for,
and its counts once it ended (the bundle's `stats.rounds`).

    webctx:job:<id>:rounds   hash  r<n> -> RoundRecord JSON (n = 2, 3...; round 1 is the
                                   job's ordinary search and fetch, recorded when it ends)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import redis


@dataclass
class RoundRecord:
    """One round: where its queries start among the job's, what it asked for, and its
    counts (set when it ends: `seconds` > 0)."""

    round: int
    started_at: float
    queries_from: int = 0
    """Index of its first query in the job's queries (round 1: 0)."""
    queries: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    facets: list[str] = field(default_factory=list)
    """The facets it looked for (weak or missing after the round before)."""
    page_allowance: int = 0
    """New pages it may fetch (links included)."""
    chosen: list[str] = field(default_factory=list)
    """The URLs it chose to fetch, once its searches ended (["-"]: none)."""
    chunks_before: int = 0
    pages: int = 0
    """New pages it chose to fetch."""
    new_chunks: int = 0
    seconds: float = 0.0
    missing: list[str] = field(default_factory=list)
    """Facets still weak or missing after it."""
    stopped: str = ""
    """Why no round followed it, for the last round."""


class RoundStore:
    """A job's round records (`key` is the job store's key of a job's part)."""

    def __init__(self, client: redis.Redis, key: Callable[[str, str], str], *, ttl_s: int) -> None:
        self._redis = client
        self._key = key
        self.ttl_s = ttl_s

    def begin(self, job_id: str, record: RoundRecord) -> bool:
        """Record a round as begun; False if it was already (a redelivered rank)."""
        name = self._key(job_id, "rounds")
        added = self._redis.hsetnx(name, f"r{record.round}", json.dumps(asdict(record)))
        self._redis.expire(name, self.ttl_s)
        return bool(added)

    def save(self, job_id: str, record: RoundRecord) -> None:
        """Write a round's record (its counts once it ended)."""
        name = self._key(job_id, "rounds")
        self._redis.hset(name, f"r{record.round}", json.dumps(asdict(record)))
        self._redis.expire(name, self.ttl_s)

    def records(self, job_id: str) -> list[RoundRecord]:
        """The job's round records, in order (empty for a job of one round)."""
        raw = cast(dict[str, str], self._redis.hgetall(self._key(job_id, "rounds")))
        records = [RoundRecord(**json.loads(v)) for v in raw.values()]
        return sorted(records, key=lambda r: r.round)

    def latest(self, job_id: str) -> RoundRecord | None:
        """The job's last round record, or None."""
        records = self.records(job_id)
        return records[-1] if records else None

    def add_urls(self, job_id: str, urls: Sequence[str], url_id: Callable[[str], str]) -> list[str]:
        """Add a round's URLs to the job's chosen ones; the ids of those it did not have."""
        name = self._key(job_id, "urls")
        have = set(cast(list[str], self._redis.hkeys(name)))
        mapping: dict[Any, Any] = {url_id(u): u for u in urls if url_id(u) not in have}
        if mapping:
            self._redis.hset(name, mapping=mapping)
            self._redis.expire(name, self.ttl_s)
        return list(mapping)

    def restart_fanins(self, job_id: str) -> None:
        """Forget that the stages after search and embed were started: a new round's last
        search and last page start them again."""
        self._redis.hdel(self._key(job_id, "meta"), "next:search", "next:embed")
