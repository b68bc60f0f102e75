"""Task records: what an MCP task handle (the tasks extension, api/mcp_tasks.py) stands
for, kept in the job store's Redis beside the job it follows.

A record names the job or batch behind the task, the tenant that created it, the tool and
when it was created. Everything else a client polls for (status, progress, the result) is
read from that job or batch, so a task is exactly as durable as the job: it survives the
restart of the MCP server, of the API and of the local service (the local service's
Valkey keeps an append-only file), and ends when the job's keys expire.

Task ids are 192-bit random tokens: the id is the handle a client holds (the extension
has no listing), and only its SHA-256 is stored, as for API keys.

    webctx:task:<sha256>   hash  tenant, kind, target, tool, created_at, ttl_s
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Literal, cast

import redis

TaskKind = Literal["job", "batch"]
MAX_TASK_ID = 64
"""Characters of a task id at most: anything longer is no id of ours (never looked up)."""


@dataclass(frozen=True)
class TaskRecord:
    """One task handle: whose it is and what it follows."""

    task_id: str
    tenant: str
    kind: TaskKind
    target: str
    """The job id (kind `job`) or batch id (kind `batch`)."""
    tool: str
    created_at: float
    ttl_s: int


def _key(task_id: str) -> str:
    return f"webctx:task:{hashlib.sha256(task_id.encode()).hexdigest()}"


class TaskRecords:
    """Task records in Redis; each expires `ttl_s` after its creation (the job TTL)."""

    def __init__(self, client: redis.Redis, *, ttl_s: int) -> None:
        self._redis = client
        self.ttl_s = ttl_s

    def create(self, *, tenant: str, kind: TaskKind, target: str, tool: str) -> TaskRecord:
        """Record a new task; returns it once Redis has it (a lookup of its id resolves)."""
        record = TaskRecord(task_id=secrets.token_urlsafe(24), tenant=tenant, kind=kind,
                            target=target, tool=tool, created_at=round(time.time(), 3),
                            ttl_s=self.ttl_s)  # fmt: skip
        key = _key(record.task_id)
        pipe = self._redis.pipeline()
        pipe.hset(key, mapping={"tenant": tenant, "kind": kind, "target": target, "tool": tool,
                                "created_at": f"{record.created_at:.3f}",
                                "ttl_s": str(self.ttl_s)})  # fmt: skip
        pipe.expire(key, self.ttl_s)
        pipe.execute()
        return record

    def get(self, task_id: str) -> TaskRecord | None:
        """The task with this id, or None (unknown, expired, or not an id of ours)."""
        if not task_id or len(task_id) > MAX_TASK_ID:
            return None
        fields = cast(dict[str, str], self._redis.hgetall(_key(task_id)))
        if not fields.get("target") or fields.get("kind") not in ("job", "batch"):
            return None
        return TaskRecord(
            task_id=task_id,
            tenant=fields.get("tenant", ""),
            kind=cast(TaskKind, fields["kind"]),
            target=fields["target"],
            tool=fields.get("tool", ""),
            created_at=float(fields.get("created_at") or 0.0),
            ttl_s=int(fields.get("ttl_s") or self.ttl_s),
        )
