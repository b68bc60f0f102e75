"""Hostile or odd input at the HTTP API and the CLI: refused with a 4xx (or the CLI's
usage exit) and a reason, never a 500, a traceback, or state that grows without bound.
A real `webctx api` and `webctx worker` on the test Redis (the module's API stack)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.integration.conftest import ApiStack
from webctx.devweb.searxng import searxng_control
from webctx.jobs.quota import StoredBytes
from webctx.settings import Settings

# One xdist worker runs this module: its tests share one API stack (module fixture).
pytestmark = pytest.mark.xdist_group("api_stack")

DEEP = "[" * 5_000 + "]" * 5_000  # ~10 KB; past the JSON decoder's depth limit
QUESTION = "how do lithium-ion batteries degrade?"
LONGEST_NAME = ".".join(["a" * 63] * 3 + ["a" * 61])
"""A host name of 253 characters, the most a DNS name has."""


def _redis_bytes(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def test_deeply_nested_batch_bodies_are_422_with_their_line(api_stack: ApiStack) -> None:
    good = json.dumps({"id": "a", "question": QUESTION})
    with api_stack.client() as c:
        jsonl = c.post("/v1/batches", params={"name": "deep1"},
                       content=f"{good}\n{DEEP}\n".encode())  # fmt: skip
        listed = c.post("/v1/batches", params={"name": "deep2"},
                        content=f"[{good}, {DEEP}]".encode())  # fmt: skip
        whole = c.post("/v1/batches", params={"name": "deep3"}, content=DEEP.encode())
        job = c.post("/v1/jobs", content=DEEP.encode(),
                     headers={"content-type": "application/json"})  # fmt: skip
    assert 400 <= job.status_code < 500, job.text
    for resp in (jsonl, listed, whole):
        assert resp.status_code == 422, resp.text
        assert "nested too deeply" in resp.json()["message"]
    assert "line 2" in jsonl.json()["message"] and "line 2" in listed.json()["message"]
    assert "line 1" in whole.json()["message"]


def test_deeply_nested_batch_file_is_a_usage_error_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps({"id": "a", "question": QUESTION}) + "\n" + DEEP + "\n")
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    done = run_cli(env, "batch", "submit", str(path), "--name", "deep")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "line 2: not JSON (nested too deeply)" in done.stderr
    assert "Traceback" not in done.stderr


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    yield b'{"question": "q", "include_domains": ["'
    sent = 0
    while sent < total:
        yield b"a" * size
        sent += size
    yield b'"]}'


def test_oversized_job_bodies_are_413_also_when_chunked(api_stack: ApiStack) -> None:
    client = redis.Redis.from_url(redis_url())
    before = _redis_bytes(client)
    with api_stack.client() as c:
        declared = c.post("/v1/jobs", json={"question": QUESTION,
                                            "include_domains": ["a" * 5_000_000]})  # fmt: skip
        # A generator body goes out chunked, without Content-Length.
        chunked = c.post("/v1/jobs", content=_chunks(20_000_000))
        many = c.post("/v1/context", json={"question": QUESTION,
                                           "include_domains": ["x.io"] * 200_000})  # fmt: skip
    for resp in (declared, chunked, many):
        assert resp.status_code == 413, resp.text[:300]
        assert resp.json()["error"] == "too_large"
    assert chunked.request.headers.get("transfer-encoding") == "chunked"
    assert _redis_bytes(client) - before < 5_000_000  # nothing of it was stored
    client.close()


def test_domain_lists_past_their_caps_are_422(api_stack: ApiStack) -> None:
    with api_stack.client() as c:
        long_list = c.post("/v1/jobs", json={"question": QUESTION,
                                             "include_domains": ["x.io"] * 101})  # fmt: skip
        long_entry = c.post("/v1/context", json={"question": QUESTION, "timeout_s": 1,
                                                 "exclude_domains": ["a" * 254]})  # fmt: skip
        at_caps = c.post("/v1/jobs", json={"question": QUESTION, "max_sources": 1,
                                           "include_domains": [LONGEST_NAME] * 100})  # fmt: skip
    assert long_list.status_code == 422, long_list.text
    assert long_list.json()["message"] == (
        "invalid request: include_domains must have at most 100 entries (got 101)"
    )
    assert long_entry.status_code == 422, long_entry.text
    # 254 characters are no host name (a label is 63 at most): refused naming the entry.
    assert long_entry.json()["message"].startswith("invalid request: exclude_domains[0]: 'aaa")
    assert at_caps.status_code == 202, at_caps.text


def test_domains_that_are_not_host_names_are_422_naming_them(api_stack: ApiStack) -> None:
    client = redis.Redis.from_url(redis_url())
    # Job ids, not keys: an earlier test's job may still be writing its own keys meanwhile.
    jobs_before = _job_ids(client)
    with api_stack.client() as c:
        job = c.post("/v1/jobs", json={"question": QUESTION,
                                       "include_domains": ["file:///etc/passwd"]})  # fmt: skip
        context = c.post("/v1/context", json={
            "question": QUESTION, "timeout_s": 1,
            "exclude_domains": ["ok.example", "javascript:alert(1)"]})  # fmt: skip
        items = [{"id": "ok", "question": QUESTION},
                 {"id": "ip", "question": QUESTION, "include_domains": ["10.0.0.1"]}]  # fmt: skip
        batch = c.post("/v1/batches", params={"name": "hosts"}, json=items)
    for resp, where, value in ((job, "include_domains[0]", "file:///etc/passwd"),
                               (context, "exclude_domains[1]", "javascript:alert(1)"),
                               (batch, "line 2: include_domains[0]", "10.0.0.1")):  # fmt: skip
        assert resp.status_code == 422, resp.text
        message = resp.json()["message"]
        assert where in message and repr(value) in message, message
    assert _job_ids(client) == jobs_before  # nothing was started
    client.close()


def _job_ids(client: redis.Redis) -> set[bytes]:
    """The ids of the jobs the job store holds."""
    return {key.split(b":")[2] for key in client.keys("webctx:job:*")}


def test_a_questions_control_characters_never_reach_search_or_the_bundle(
    api_stack: ApiStack,
) -> None:
    queries = searxng_control(api_stack.web.search.app).queries
    before = len(queries)
    with api_stack.client() as c:
        hostile = "how do\u0000 lithium-ion\u001b[2J batteries\u001b]0;x\u0007 degrade?\u009b1m"
        body = {"question": hostile, "max_sources": 2, "timeout_s": 60}
        resp = c.post("/v1/context", json=body, timeout=90)
    assert resp.status_code == 200, resp.text
    assert resp.json()["question"] == QUESTION
    assert queries[before:] and all(q.isprintable() for q in queries[before:])


def test_batch_items_past_the_domain_caps_are_422(api_stack: ApiStack) -> None:
    items = [{"id": "ok", "question": QUESTION, "include_domains": ["x.io"]},
             {"id": "long", "question": QUESTION, "exclude_domains": ["x.io"] * 101}]  # fmt: skip
    with api_stack.client() as c:
        resp = c.post("/v1/batches", params={"name": "domains"}, json=items)
    assert resp.status_code == 422, resp.text
    assert "item 'long'" in resp.json()["message"]
    assert "exclude_domains" in resp.json()["message"]


def test_context_of_a_failed_job_returns_its_bundle(api_stack: ApiStack) -> None:
    body = {"question": QUESTION, "include_domains": ["nothing-matches.invalid"],
            "timeout_s": 60}  # fmt: skip
    started = time.monotonic()
    with api_stack.client() as c:
        resp = c.post("/v1/context", json=body, timeout=90)
        assert resp.status_code == 200, resp.text
        job_id = resp.headers["x-webctx-job-id"]
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "failed"
        assert c.get(f"/v1/jobs/{job_id}/bundle").json() == resp.json()
    assert resp.json()["job_id"] == job_id and resp.json()["sources"] == []
    assert time.monotonic() - started < 50  # answered when it failed, not at the timeout


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.2:{port}/sitemap.xml", "http://10.0.0.1/feed.xml",
     "http://user:secret@127.0.0.1:{port}/a.html", "http://169.254.169.254/latest"],
)  # fmt: skip
def test_sources_on_forbidden_addresses_are_refused_at_registration(
    api_stack: ApiStack, url: str
) -> None:
    port = api_stack.web.site.port
    with api_stack.client() as c:
        resp = c.post("/v1/sources", json={"url": url.format(port=port), "every": "1h"})
        assert resp.status_code == 422, resp.text
        assert "source URL refused" in resp.json()["message"]
        assert c.get("/v1/sources").json() == []
        allowed = c.post("/v1/sources", json={"url": f"{api_stack.web.site.url}/a.html"})
        assert allowed.status_code == 201, allowed.text
        assert c.delete(f"/v1/sources/{allowed.json()['source_id']}").status_code == 204


def test_cli_refuses_a_source_on_a_forbidden_address(api_stack: ApiStack) -> None:
    url = f"http://127.0.0.2:{api_stack.web.site.port}/sitemap.xml"
    done = run_cli(api_stack.env, "sources", "add", url)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "source URL refused" in done.stderr and "127.0.0.2" in done.stderr


def test_refresh_run_without_sources_is_readable_by_its_creator(api_stack: ApiStack) -> None:
    with api_stack.client("alpha") as alpha, api_stack.client("beta") as beta:
        run = alpha.post("/v1/sources/refresh", json={})
        assert run.status_code == 202, run.text
        assert run.json()["pending"] == 0 and run.json()["tenant"] == "alpha"
        run_id = run.json()["run_id"]
        mine = alpha.get(f"/v1/sources/runs/{run_id}")
        assert mine.status_code == 200 and mine.json()["run_id"] == run_id
        assert beta.get(f"/v1/sources/runs/{run_id}").status_code == 404


def test_a_tenant_past_its_stored_bytes_is_refused_and_another_is_not(
    api_stack: ApiStack,
) -> None:
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    limit = Settings().tenant_max_stored_bytes  # the stack runs with the default
    # alpha's jobs hold all but 10 bytes of its quota: a stand-in job that expires in 10 s.
    StoredBytes(client, ttl_s=10).add("alpha", "filler", limit - 10)
    body = {"question": QUESTION}
    with api_stack.client("alpha") as alpha, api_stack.client("beta") as beta:
        refused = alpha.post("/v1/jobs", json=body)
        keyed = alpha.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
        context = alpha.post("/v1/context", json=body)
        before = StoredBytes(client, ttl_s=10).total("beta")
        other = beta.post("/v1/jobs", json=body)
        for resp in (refused, keyed, context):
            assert resp.status_code == 403, resp.text
            assert resp.json()["error"] == "quota_exceeded"
            assert "WEBCTX_TENANT_MAX_STORED_BYTES" in resp.json()["message"]
        assert other.status_code == 202, other.text
        assert StoredBytes(client, ttl_s=10).total("beta") > before
        # Once the stand-in expires, alpha is admitted, and the refused key names no job.
        deadline = time.monotonic() + 30
        while StoredBytes(client, ttl_s=10).total("alpha") > limit - 1_000:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        admitted = alpha.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
    assert admitted.status_code == 202, admitted.text
    assert admitted.headers.get("Idempotent-Replayed") is None
    client.close()


def test_a_refresh_interval_below_the_floor_is_refused_by_the_api_and_the_cli(
    api_stack: ApiStack,
) -> None:
    page = f"{api_stack.web.site.url}/a.html"
    with api_stack.client() as c:
        resp = c.post("/v1/sources", json={"url": page, "every": "1s"})
        assert resp.status_code == 422, resp.text
        assert "below the minimum of 300 s" in resp.json()["message"]
        assert c.get("/v1/sources").json() == []
    done = run_cli(api_stack.env, "sources", "add", page, "--every", "4m")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "refresh interval 240 s is below the minimum of 300 s" in done.stderr
    listed = run_cli(api_stack.env, "sources", "list", "--format", "json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
