"""API keys: hashed at rest, resolved to tenants, revoked, rate-limited per key."""

from __future__ import annotations

import fakeredis
import pytest

from webctx.errors import InvalidTenant
from webctx.jobs.tenants import TenantStore, hash_key


@pytest.fixture
def store() -> TenantStore:
    return TenantStore(fakeredis.FakeRedis(decode_responses=True))


def test_key_is_stored_only_as_its_sha256(store: TenantStore) -> None:
    key, record = store.create_key("acme")
    assert key.startswith("wctx_") and len(key) > 40
    dumped = {k: store._redis.dump(k) for k in store._redis.keys("*")}
    assert not any(key in k or (v and key.encode() in v) for k, v in dumped.items())
    assert f"webctx:apikey:{hash_key(key)}" in dumped
    resolved = store.resolve(key)
    assert resolved is not None and resolved.tenant == "acme"
    assert resolved.key_id == record.key_id


def test_unknown_and_malformed_keys_resolve_to_nothing(store: TenantStore) -> None:
    store.create_key("acme")
    assert store.resolve("wctx_" + "x" * 43) is None
    assert store.resolve("not-a-key") is None
    assert store.resolve("wctx_" + "x" * 500) is None


@pytest.mark.parametrize("by_id", [True, False])
def test_revoke_by_key_or_id(store: TenantStore, by_id: bool) -> None:
    key, record = store.create_key("acme")
    assert store.revoke(record.key_id if by_id else key)
    assert store.resolve(key) is None
    assert not store.revoke(key)


def test_tenant_names_are_checked(store: TenantStore) -> None:
    with pytest.raises(InvalidTenant):
        store.create_key("bad tenant/../x")


def test_rate_limit_counts_per_key_and_window(store: TenantStore) -> None:
    _, a = store.create_key("acme", rate_limit=2)
    _, b = store.create_key("acme")
    decisions = [store.hit(a.key_id, limit=2) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert 1 <= decisions[-1].retry_after_s <= 60 and decisions[-1].remaining == 0
    assert store.hit(b.key_id, limit=2).allowed
    assert a.rate_limit == 2 and b.rate_limit is None
