"""A job or a batch named the way people copy it: its full id, or a unique prefix of it
(progress lines show 8 characters), looked up among one tenant's.

The lookup is one ZSCAN of an index the tenant already has (its jobs: the quota's sorted
set, `webctx.jobs.quota`; its batches: `webctx.jobs.batches`), never a SCAN of the
keyspace, and only the tenant's own ids can match. The command line resolves prefixes;
the HTTP API and the MCP tools take full ids (their clients hold them, and a prefix there
would make one URL name different jobs over time).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import redis

from webctx.errors import InvalidRequest, JobNotFound

MIN_PREFIX = 4
"""Characters a prefix needs at least: with 16 possible characters each, 4 tell apart a
tenant's few hundred live jobs in most cases, and a shorter one would rarely be unique."""
SHOWN = 3
"""Candidates an ambiguous prefix's error shows."""
_ID_CHARS = re.compile(r"[A-Za-z0-9_-]{1,64}")  # no glob character: safe in a MATCH pattern


def live_with_prefix(client: redis.Redis, index: str, prefix: str) -> list[str]:
    """Members of the sorted set `index` (scores: when each expires) that start with
    `prefix` and have not expired, sorted."""
    if not _ID_CHARS.fullmatch(prefix):
        return []
    now = time.time()
    found = client.zscan_iter(index, match=f"{prefix}*", count=1000)
    return sorted(str(member) for member, expires in found if expires > now)


def pick(
    kind: str,
    ref: str,
    *,
    exists: Callable[[str], bool],
    with_prefix: Callable[[str], list[str]],
    not_found: Callable[[str], JobNotFound] = JobNotFound,
) -> str:
    """The id `ref` names: itself when `exists` says so (a full id), else the one id
    `with_prefix` finds for it. `not_found(ref)` when none does; InvalidRequest when `ref`
    is no id, shorter than MIN_PREFIX, or the prefix of several (how many, and the
    first few)."""
    ref = ref.strip()
    if not _ID_CHARS.fullmatch(ref):
        raise InvalidRequest(f"{kind} id {ref[:80]!r}: ids hold letters, digits, '_' and '-'")
    if exists(ref):
        return ref
    if len(ref) < MIN_PREFIX:
        raise InvalidRequest(
            f"{kind} id {ref!r} is too short: give at least {MIN_PREFIX} characters of it"
        )
    found = with_prefix(ref)
    if not found:
        raise not_found(ref)
    if len(found) > 1:
        shown = ", ".join(found[:SHOWN])
        more = ", …" if len(found) > SHOWN else ""
        raise InvalidRequest(
            f"{kind} id prefix {ref!r} matches {len(found)} {kind}s ({shown}{more}): "
            "give more characters"
        )
    return found[0]
