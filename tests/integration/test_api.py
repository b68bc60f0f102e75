"""The HTTP jobs API over real HTTP: a `webctx api` process, a `webctx worker`, Redis,
and the paced loopback web."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import run_cli
from tests.integration.conftest import ApiStack
from webctx.models import Bundle

# One xdist worker runs this module: its tests share one API stack (module fixture).
pytestmark = pytest.mark.xdist_group("api_stack")

QUESTION = "how do lithium-ion batteries degrade?"
SMALL = {"question": QUESTION, "max_sources": 4, "top_k": 6, "token_budget": 800}


def _wait(client: httpx.Client, job_id: str, timeout_s: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = client.get(f"/v1/jobs/{job_id}").json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            return dict(body)
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {body}")


def test_submit_poll_and_read_bundle_as_json_and_markdown(api_stack: ApiStack) -> None:
    with api_stack.client() as c:
        resp = c.post("/v1/jobs", json=SMALL)
        assert resp.status_code == 202, resp.text
        job = resp.json()
        assert resp.headers["location"] == f"/v1/jobs/{job['job_id']}" == job["links"]["status"]
        assert job["status"] in ("queued", "running")
        done = _wait(c, job["job_id"])
        assert done["status"] == "succeeded"
        progress = done["progress"]
        assert isinstance(progress, dict)
        assert progress["urls"] == 4 and progress["fetched"] + progress["failed"] == 4
        assert progress["embedded"] == 4 and progress["chunks"] > 0
        bundle = Bundle.model_validate(c.get(f"/v1/jobs/{job['job_id']}/bundle").json())
        assert bundle.job_id == job["job_id"] and bundle.chunks and bundle.sources
        assert all(s.url.startswith(api_stack.web.site.url) for s in bundle.sources)
        md = c.get(f"/v1/jobs/{job['job_id']}/bundle", params={"format": "markdown"})
        assert md.headers["content-type"].startswith("text/markdown")
        assert QUESTION in md.text and "[1]" in md.text


def test_events_stream_progress_then_end(api_stack: ApiStack) -> None:
    with api_stack.client() as c:
        job_id = c.post("/v1/jobs", json=SMALL).json()["job_id"]
        events: list[tuple[str, dict[str, object]]] = []
        with c.stream("GET", f"/v1/jobs/{job_id}/events", timeout=60) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            kind = ""
            for line in resp.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:"):
                    events.append((kind, json.loads(line.split(":", 1)[1])))
    kinds = [k for k, _ in events]
    assert kinds[-1] == "end" and set(kinds[:-1]) <= {"progress"} and len(kinds) >= 3
    assert events[-1][1]["status"] == "succeeded"
    embedded = [e["progress"]["embedded"] for _, e in events]  # type: ignore[index]
    assert embedded == sorted(embedded) and embedded[-1] == 4


def test_idempotency_key_returns_the_same_job(api_stack: ApiStack) -> None:
    with api_stack.client() as c:
        headers = {"Idempotency-Key": "order-42"}
        first = c.post("/v1/jobs", json=SMALL, headers=headers)
        again = c.post("/v1/jobs", json=SMALL, headers=headers)
        assert first.status_code == again.status_code == 202
        assert first.json()["job_id"] == again.json()["job_id"]
        assert again.headers["idempotent-replayed"] == "true"
        other = c.post("/v1/jobs", json={**SMALL, "top_k": 3}, headers=headers)
        assert other.status_code == 409 and "different request" in other.json()["message"]
        fresher = c.post("/v1/jobs", json={**SMALL, "max_age": 0}, headers=headers)
        assert fresher.status_code == 409  # max_age is part of the request
        _wait(c, first.json()["job_id"])
    with api_stack.client("beta") as c:  # keys are per tenant
        theirs = c.post("/v1/jobs", json=SMALL, headers=headers)
        assert theirs.json()["job_id"] != first.json()["job_id"]
        _wait(c, theirs.json()["job_id"])


def test_tenants_never_see_each_others_jobs(api_stack: ApiStack) -> None:
    with api_stack.client("alpha") as alpha, api_stack.client("beta") as beta:
        job_id = alpha.post("/v1/jobs", json=SMALL).json()["job_id"]
        _wait(alpha, job_id)
        for method, path in [
            ("GET", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/jobs/{job_id}/bundle"),
            ("GET", f"/v1/jobs/{job_id}/events"),
            ("DELETE", f"/v1/jobs/{job_id}"),
        ]:
            resp = beta.request(method, path)
            assert resp.status_code == 404, (method, path, resp.text)
            assert resp.json()["error"] == "not_found"
        assert alpha.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"


def test_auth_failures_are_401_and_rate_limit_is_429(api_stack: ApiStack) -> None:
    url = api_stack.url
    missing = httpx.get(f"{url}/v1/jobs/abc")
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    bogus = httpx.get(f"{url}/v1/jobs/abc", headers={"Authorization": "Bearer wctx_nope"})
    assert bogus.status_code == 401 and bogus.json()["error"] == "unauthorized"
    key = run_cli(api_stack.env, "keys", "create", "--tenant", "gamma", "--rate-limit", "3")
    token = key.stdout.strip()
    auth = {"Authorization": f"Bearer {token}"}
    for _ in range(3):  # the limit counts per minute: redo a run that straddled a minute
        window = int(time.time() // 60)
        codes = [httpx.get(f"{url}/v1/jobs/abc", headers=auth).status_code for _ in range(4)]
        if int(time.time() // 60) == window:
            break
        time.sleep(max(0.0, 61 - time.time() % 60))  # past the next boundary: a fresh window
    assert codes == [404, 404, 404, 429]
    limited = httpx.get(f"{url}/v1/jobs/abc", headers=auth)
    assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 60
    assert run_cli(api_stack.env, "keys", "revoke", token).returncode == 0
    assert httpx.get(f"{url}/v1/jobs/abc", headers=auth).status_code == 401


def test_bad_input_is_422_unknown_job_404_and_health(api_stack: ApiStack) -> None:
    with api_stack.client() as c:
        bad = c.post("/v1/jobs", json={"question": "  ", "max_sources": 0, "top_k": "lots"})
        assert bad.status_code == 422
        assert bad.json()["message"] == (  # plain words; the same on every surface
            "invalid request: question must contain text; max_sources must be between 1 and"
            " 100 (got 0); top_k must be a whole number (got 'lots')"
        ), bad.json()
        assert [(d["loc"], d["type"]) for d in bad.json()["detail"]] == [
            (["body", "question"], "value_error"), (["body", "max_sources"], "greater_than_equal"),
            (["body", "top_k"], "int_parsing")]  # fmt: skip
        assert "pydantic" not in bad.text
        assert c.post("/v1/jobs", content=b"{not json").status_code == 422
        assert c.post("/v1/jobs", json={**SMALL, "bogus": 1}).status_code == 422
        too_old = c.post("/v1/context", json={**SMALL, "max_age": -2})
        assert too_old.status_code == 422 and "max_age" in too_old.json()["message"]
        assert c.get("/v1/jobs/" + "0" * 32).status_code == 404
        assert c.get("/v1/jobs/" + "0" * 32 + "/bundle").json()["error"] == "not_found"
    assert httpx.get(f"{api_stack.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{api_stack.url}/readyz")
    assert ready.status_code == 200, ready.text
    assert set(ready.json()["checks"]) == {"job_store", "broker", "result_backend", "vector_store"}


def test_context_returns_the_bundle_in_one_call(api_stack: ApiStack) -> None:
    with api_stack.client() as c:
        resp = c.post("/v1/context", json={**SMALL, "timeout_s": 60}, timeout=90)
        assert resp.status_code == 200, resp.text
        bundle = Bundle.model_validate(resp.json())
        assert bundle.chunks and resp.headers["x-webctx-job-id"] == bundle.job_id
        md = c.post("/v1/context", json={**SMALL, "format": "markdown"}, timeout=90)
        assert md.status_code == 200 and "[1]" in md.text


def test_cancel_stops_further_fetches(api_stack: ApiStack) -> None:
    hits = api_stack.web.hits
    with api_stack.client() as c:
        before = sum(hits.values())
        job_id = c.post("/v1/jobs", json={**SMALL, "max_sources": 20}).json()["job_id"]
        deadline = time.monotonic() + 20
        while sum(hits.values()) == before and time.monotonic() < deadline:
            time.sleep(0.02)
        resp = c.delete(f"/v1/jobs/{job_id}")
        assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
        at_cancel = sum(hits.values())
        time.sleep(3)  # long enough for every queued fetch of the job to have run
        after = sum(hits.values())
        status = c.get(f"/v1/jobs/{job_id}").json()
        assert status["status"] == "cancelled"
        assert c.get(f"/v1/jobs/{job_id}/bundle").status_code == 409
    # Fetches already past their is_active check may still land (worker threads: 4).
    assert after - at_cancel <= 4, (before, at_cancel, after, dict(hits))
    assert status["progress"]["urls"] >= 12
    assert after - before < status["progress"]["urls"] - 4, (before, at_cancel, after)


@pytest.mark.slow
def test_api_latency_matches_the_cli(api_stack: ApiStack) -> None:
    """One job through the API and through `webctx research`, same web and worker."""
    request = {**SMALL, "max_sources": 8}
    with api_stack.client() as c:
        started = time.monotonic()
        resp = c.post("/v1/context", json=request, timeout=90)
        api_s = time.monotonic() - started
    assert resp.status_code == 200
    started = time.monotonic()
    done = run_cli(
        api_stack.env,
        "research",
        QUESTION,
        "--max-sources",
        "8",
        "--top-k",
        "6",
        "--token-budget",
        "800",
    )
    cli_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    print(f"latency: api {api_s:.2f} s, cli {cli_s:.2f} s")
    assert api_s < cli_s + 5
