"""API keys mapped to tenants, kept hashed in Redis, with a per-key request rate limit.

Keys are 256-bit random tokens (`wctx_<43 url-safe chars>`), so a single SHA-256 is the
right hash: a slow password hash (bcrypt, argon2) defends low-entropy secrets against
guessing, and nobody can guess 2**256; a fast hash keeps every request's lookup to one
Redis GET. Only the hash is stored; the key is shown once, at creation.

    webctx:apikey:<sha256>   hash  tenant, key_id, created_at, rate_limit
    webctx:apikey-id:<id>    str   sha256 (so `webctx keys revoke ID` works without the key)
    webctx:ratelimit:<id>:<window>  counter, expires with its window
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, cast

import redis

from webctx.errors import InvalidTenant

KEY_PREFIX = "wctx_"
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ApiKey:
    """What a stored key grants: its tenant, its public id and its request rate."""

    key_id: str
    tenant: str
    created_at: float
    rate_limit: int | None = None


@dataclass(frozen=True)
class RateDecision:
    """Outcome of counting one request against a key's limit."""

    allowed: bool
    limit: int
    remaining: int
    retry_after_s: int


def hash_key(key: str) -> str:
    """SHA-256 hex of a key: what is stored and looked up."""
    return hashlib.sha256(key.encode()).hexdigest()


def check_tenant(name: str) -> str:
    """The tenant name, or InvalidTenant."""
    if not _TENANT_RE.match(name):
        raise InvalidTenant(f"invalid tenant {name!r}: 1-64 characters of [A-Za-z0-9._-]")
    return name


class TenantStore:
    """Create, resolve and revoke API keys; count requests per key."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def create_key(self, tenant: str, *, rate_limit: int | None = None) -> tuple[str, ApiKey]:
        """A new key for `tenant`: (the key, shown once; its stored record)."""
        check_tenant(tenant)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = hash_key(key)
        record = ApiKey(
            key_id=digest[:12], tenant=tenant, created_at=time.time(), rate_limit=rate_limit
        )
        fields: dict[Any, Any] = {
            "tenant": tenant,
            "key_id": record.key_id,
            "created_at": f"{record.created_at:.3f}",
        }
        if rate_limit is not None:
            fields["rate_limit"] = str(rate_limit)
        pipe = self._redis.pipeline()
        pipe.hset(f"webctx:apikey:{digest}", mapping=fields)
        pipe.set(f"webctx:apikey-id:{record.key_id}", digest)
        pipe.execute()
        return key, record

    def resolve(self, key: str) -> ApiKey | None:
        """The record of a live key, or None for an unknown or revoked one."""
        if not key.startswith(KEY_PREFIX) or len(key) > 200:
            return None
        raw = cast(dict[str, str], self._redis.hgetall(f"webctx:apikey:{hash_key(key)}"))
        if not raw:
            return None
        limit = raw.get("rate_limit")
        return ApiKey(
            key_id=raw["key_id"],
            tenant=raw["tenant"],
            created_at=float(raw["created_at"]),
            rate_limit=int(limit) if limit else None,
        )

    def revoke(self, key_or_id: str) -> bool:
        """Revoke by the key itself or by its key id; False if nothing matched."""
        if key_or_id.startswith(KEY_PREFIX):
            digest: str | None = hash_key(key_or_id)
        else:
            digest = cast("str | None", self._redis.get(f"webctx:apikey-id:{key_or_id}"))
        if not digest:
            return False
        pipe = self._redis.pipeline()
        pipe.delete(f"webctx:apikey:{digest}")
        pipe.delete(f"webctx:apikey-id:{digest[:12]}")
        removed = pipe.execute()[0]
        return bool(removed)

    def hit(self, key_id: str, *, limit: int, window_s: int = 60) -> RateDecision:
        """Count one request in the current fixed window; allowed while within `limit`."""
        now = time.time()
        window = int(now // window_s)
        name = f"webctx:ratelimit:{key_id}:{window}"
        pipe = self._redis.pipeline()
        pipe.incr(name)
        pipe.expire(name, window_s + 1)
        count = int(pipe.execute()[0])
        retry_after = max(1, int((window + 1) * window_s - now + 0.999))
        return RateDecision(
            allowed=count <= limit,
            limit=limit,
            remaining=max(0, limit - count),
            retry_after_s=retry_after,
        )
