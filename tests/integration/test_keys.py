"""Every key a research job, a batch and a source refresh leave in a real Redis belongs to
a registered family (webctx/keys.py, and the broker's own in the Celery settings) and
expires as its family says; a tenant's stored bytes can be counted from the registry."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.testweb import LoopbackWeb
from webctx.keys import FAMILIES, KeyFamily, family_of, tenant_bytes
from webctx.workers.celeryconfig import REDIS_BROKER_KEYS

TENANT = "keys-test"
QUESTIONS = ["why does the SEI layer keep growing?", "lithium plating when charging cold"]


def test_every_key_belongs_to_a_family_and_obeys_its_expiry(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(**test_web.env(), CELERY_BROKER_URL=redis_url(), WEBCTX_LOCAL_TENANT=TENANT,
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"))  # fmt: skip
    start_worker(env, "-c", "4")
    done = run_cli(env, "research", QUESTIONS[0], "--max-sources", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    batch = tmp_path / "q.jsonl"
    batch.write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n"
                             for i, q in enumerate(QUESTIONS)))  # fmt: skip
    fed = run_cli(env, "batch", "submit", str(batch), "--name", "keys", "--max-sources", "2",
                  "--wait", "--out", str(tmp_path / "out.jsonl"))  # fmt: skip
    assert fed.returncode == 0, fed.stderr[-3000:]
    page = test_web.site.url + "/energy-notes/sei-growth.html"
    assert run_cli(env, "sources", "add", page, "--every", "1h").returncode == 0
    refreshed = run_cli(env, "sources", "refresh", "--wait", "--timeout", "120")
    assert refreshed.returncode == 0, refreshed.stderr[-3000:]

    seen: dict[str, list[str]] = {}
    wrong: list[str] = []
    for key in redis_client.scan_iter(count=1000):
        family = family_of(key, FAMILIES + REDIS_BROKER_KEYS)
        if family is None:
            wrong.append(f"{key!r}: no family")
            continue
        seen.setdefault(family.pattern, []).append(key)
        problem = _expiry_problem(redis_client, key, family)
        if problem:
            wrong.append(f"{key!r} ({family.pattern}): {problem}")
    assert wrong == [], "\n".join(wrong)
    # The run reached every part of the engine whose keys the registry promises.
    for pattern in ("webctx:job:{job_id}:{part}", "webctx:batch:{batch_id}",
                    "webctx:emb:{text_digest}", "webctx:rl:{namespace}:{part}",
                    "webctx:pace:{host}", "webctx:index:{tenant}:pages",
                    "webctx:index:{tenant}:gen", "webctx:sources:{tenant}"):  # fmt: skip
        assert pattern in seen, pattern

    counted = tenant_bytes(redis_client, TENANT)
    named = sum(int(redis_client.memory_usage(k) or 0)
                for f in FAMILIES if f.scope == "tenant" for k in seen.get(f.pattern, ())
                if TENANT in k)  # fmt: skip
    assert counted == named > 0
    assert tenant_bytes(redis_client, "another-tenant") == 0


def _expiry_problem(client: redis.Redis, key: str, family: KeyFamily) -> str | None:
    """What is wrong with the key's TTL for its family, if anything (a key gone since the
    scan is fine)."""
    ttl = int(client.pttl(key))
    if ttl == -2 or family.expiry == "external":
        return None
    if family.expiry == "ttl" and ttl < 0:
        return "never expires"
    if family.expiry == "none" and ttl >= 0:
        return f"expires in {ttl} ms"
    return None
