"""The freshness contract: which copy of a page a job accepts instead of a download, and
how the bundle says where each source came from.

The job engine runs on the test Redis with a fake conditional fetcher (a Protocol fake:
ETag = version counter, 304 on a match); the loopback-web version with real workers is in
tests/integration/test_freshness.py.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic
import pytest
import redis

from tests.conftest import redis_url
from tests.factories import make_chunk, make_page
from tests.unit.test_index import BASE, FakeSite, article
from webctx.jobs.engine import Engine
from webctx.jobs.fetching import fetch_for_job
from webctx.jobs.freshness import freshness_for, retrieval
from webctx.models import BundleStats, JobRequest, ScoredChunk
from webctx.settings import Settings
from webctx.stages.bundle import build_bundle, render_markdown

URL = BASE + "/a.html"


def _request(**fields: object) -> JobRequest:
    return JobRequest.model_validate({"question": "narwhal facts", **fields})


def test_default_max_age_is_the_page_cache_window_and_windows_cap_it() -> None:
    default = freshness_for(_request(), created_at=0, cache_ttl_s=86400, index_max_age_s=3600)
    assert (default.cache_max_age_s, default.index_max_age_s) == (86400, 3600)
    capped = freshness_for(
        _request(max_age=10**6), created_at=0, cache_ttl_s=86400, index_max_age_s=3600
    )
    assert (capped.cache_max_age_s, capped.index_max_age_s) == (86400, 3600)
    short = freshness_for(_request(max_age=60), created_at=0, cache_ttl_s=86400,
                          index_max_age_s=3600)  # fmt: skip
    assert (short.cache_max_age_s, short.index_max_age_s) == (60, 60)
    off = freshness_for(_request(max_age=60), created_at=0, cache_ttl_s=0, index_max_age_s=0)
    assert (off.cache_max_age_s, off.index_max_age_s) == (0, 0)


def test_without_max_age_a_job_that_does_not_read_the_caches_downloads_anew() -> None:
    broker = freshness_for(_request(), created_at=0, cache_ttl_s=86400, index_max_age_s=3600,
                           cache_by_default=False)  # fmt: skip
    assert (broker.cache_max_age_s, broker.index_max_age_s) == (0, 3600)
    asked = freshness_for(_request(max_age=600), created_at=0, cache_ttl_s=86400,
                          index_max_age_s=3600, cache_by_default=False)  # fmt: skip
    assert (asked.cache_max_age_s, asked.index_max_age_s) == (600, 600)


def test_max_age_zero_accepts_only_copies_confirmed_since_the_job_began() -> None:
    fresh = freshness_for(_request(max_age=0), created_at=1000.0, cache_ttl_s=86400,
                          index_max_age_s=86400)  # fmt: skip
    assert fresh.cache_max_age_s == 0
    assert fresh.accepts(1000.5, window_s=0, now=1001.0)
    assert not fresh.accepts(999.9, window_s=0, now=1001.0)
    assert fresh.accepts(990.0, window_s=60, now=1001.0)  # within a 60 s window


def test_max_age_is_seconds_from_zero_minus_one_is_cache_only_and_below_is_refused() -> None:
    assert _request(max_age=0).max_age == 0
    assert _request().max_age is None and not _request().stale_if_error
    with pytest.raises(pydantic.ValidationError):
        _request(max_age=-2)
    only = freshness_for(_request(max_age=-1), created_at=0, cache_ttl_s=60, index_max_age_s=0)
    assert only.cache_only and only.cache_max_age_s == math.inf and only.index_max_age_s == 0
    assert only.accepts(0.0, window_s=only.cache_max_age_s, now=10**9)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Engine, FakeSite]]:
    from webctx.adapters.hash_embedder import HashEmbedder
    from webctx.workers.deps import build_engine, stores_on

    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    settings = Settings(redis_url=redis_url(), embedding_provider="hash",
                        qdrant_path=tmp_path / "q")  # fmt: skip
    stores = stores_on(client, settings)
    built = build_engine(settings, stores, state=client, start=lambda stage, arguments: None)
    site = FakeSite()
    site.put("/a.html", article("narwhal"))
    yield dataclasses.replace(built, fetcher=site, embedder=HashEmbedder()), site
    client.flushdb()
    client.close()


def _job(engine: Engine, *, batch: str | None = None, **fields: Any) -> tuple[str, str]:
    job_id = engine.jobs.create(_request(**fields), tenant="acme", batch=batch)
    (url_id,) = engine.jobs.set_urls(job_id, [URL]).values()
    return job_id, url_id


def _get(engine: Engine, **fields: Any) -> tuple[str, Any]:
    """Run the fetch of a new job: (job id, how it got the page, None if it failed)."""
    job_id, url_id = _job(engine, **fields)
    page = fetch_for_job(engine, job_id, url_id, URL)
    how = next(iter(engine.jobs.retrievals(job_id).values()), None) if page else None
    return job_id, how


def test_second_job_reuses_the_cached_page_and_max_age_zero_downloads(
    engine: tuple[Engine, FakeSite],
) -> None:
    eng, site = engine
    _, first = _get(eng)
    assert first is not None and first.retrieved == "live"
    _, second = _get(eng)
    assert second.retrieved == "cached" and len(site.requests) == 1
    gap = second.checked_at - first.checked_at
    assert abs(gap.total_seconds()) < 0.01  # the download's time (kept to the millisecond)
    job_id, third = _get(eng, max_age=0)
    assert third.retrieved == "live" and len(site.requests) == 2
    assert site.requests[-1] == (URL, None)  # no validators: a full download
    assert third.checked_at.timestamp() >= eng.jobs.created_at(job_id)


def test_broker_mode_interactive_jobs_take_the_cache_only_when_they_name_a_max_age(
    engine: tuple[Engine, FakeSite],
) -> None:
    embedded, site = engine
    broker = embedded.settings.model_copy(update={"broker_url": redis_url()})
    eng = dataclasses.replace(embedded, settings=broker)
    _, first = _get(eng)
    _, again = _get(eng)
    assert (first.retrieved, again.retrieved) == ("live", "live") and len(site.requests) == 2
    _, asked = _get(eng, max_age=3600)
    assert asked.retrieved == "cached" and len(site.requests) == 2


def test_a_copy_past_max_age_is_revalidated_with_its_etag(
    engine: tuple[Engine, FakeSite],
) -> None:
    eng, site = engine
    _get(eng)
    time.sleep(1.1)
    _, how = _get(eng, max_age=1)
    assert how.retrieved == "revalidated" and site.requests[-1] == (URL, '"v1"')
    site.put("/a.html", article("narwhal", version=2))  # changed: the 304 turns into a 200
    time.sleep(1.1)
    _, changed = _get(eng, max_age=1)
    assert changed.retrieved == "live"


def test_a_failed_download_serves_the_old_copy_only_with_stale_if_error(
    engine: tuple[Engine, FakeSite],
) -> None:
    eng, site = engine
    _get(eng)
    site.delete("/a.html")
    job_id, how = _get(eng, max_age=0)
    assert how is None
    assert [f.reason for f in eng.jobs.failures(job_id)] == ["http_status"]
    job_id, stale = _get(eng, max_age=0, stale_if_error=True)
    assert stale.retrieved == "cached" and stale.stale
    assert stale.stale_reason == "http_status"
    assert eng.jobs.failures(job_id) == []
    assert eng.jobs.counters(job_id).get("pages_stale") == 1


def test_cache_only_takes_a_copy_of_any_age_and_never_downloads(
    engine: tuple[Engine, FakeSite],
) -> None:
    eng, site = engine
    job_id, nothing = _get(eng, max_age=-1)
    assert nothing is None and site.requests == []
    assert [f.reason for f in eng.jobs.failures(job_id)] == ["not_cached"]
    _get(eng)
    month_ago = time.time() - 30 * 86400  # far past the page-cache window
    eng.jobs._redis.hset(eng.page_cache._key(URL), "fetched_at", str(month_ago))
    _, old = _get(eng, max_age=-1)
    assert old.retrieved == "cached" and len(site.requests) == 1
    assert abs(old.checked_at.timestamp() - month_ago) < 0.01


def test_a_batch_item_reusing_a_remembered_failure_takes_the_stale_copy_if_allowed(
    engine: tuple[Engine, FakeSite],
) -> None:
    eng, site = engine
    _get(eng)
    day_ago = time.time() - 2 * 86400  # past the window: the next item asks the site
    eng.jobs._redis.hset(eng.page_cache._key(URL), "fetched_at", str(day_ago))
    site.delete("/a.html")
    strict_id, strict_url = _job(eng, batch="b1")
    assert fetch_for_job(eng, strict_id, strict_url, URL) is None  # 404, remembered
    asked = len(site.requests)
    lenient_id, lenient_url = _job(eng, batch="b1", stale_if_error=True)
    assert fetch_for_job(eng, lenient_id, lenient_url, URL) is not None
    assert len(site.requests) == asked  # the remembered failure: not asked again
    (how,) = eng.jobs.retrievals(lenient_id).values()
    assert how.retrieved == "cached" and how.stale and how.stale_reason == "http_status"
    assert abs(how.checked_at.timestamp() - day_ago) < 0.01


def test_batch_items_with_max_age_zero_share_a_download_made_after_they_began(
    engine: tuple[Engine, FakeSite],
) -> None:
    eng, site = engine
    _get(eng)  # an old copy: refused by max_age=0
    first_id, first_url = _job(eng, batch="b1", max_age=0)
    second_id, second_url = _job(eng, batch="b1", max_age=0)
    assert fetch_for_job(eng, first_id, first_url, URL) is not None
    assert fetch_for_job(eng, second_id, second_url, URL) is not None
    assert len(site.requests) == 2  # the old copy was not taken; the new one was shared
    assert [h.retrieved for h in eng.jobs.retrievals(second_id).values()] == ["cached"]


def test_bundle_sources_say_where_their_text_came_from_and_markdown_shows_it() -> None:
    page = make_page()
    when = datetime(2026, 5, 1, 10, 2, tzinfo=UTC)
    ranked = [ScoredChunk(chunk=make_chunk(page, end=20), url=page.url, score=0.9)]
    how = {page.content_sha256: retrieval("cached", when, stale_reason="http_503")}
    bundle = build_bundle(job_id="j", question="q", queries=["q"], ranked=ranked,
                          pages={page.content_sha256: page}, failures=[],
                          stats=BundleStats(), retrievals=how)  # fmt: skip
    (source,) = bundle.sources
    assert (source.retrieved, source.checked_at, source.stale) == ("cached", when, True)
    markdown = render_markdown(bundle)
    assert "cached, checked 2026-05-01 10:02 UTC, STALE: live fetch failed (http_503)" in markdown
    plain = build_bundle(job_id="j", question="q", queries=["q"], ranked=ranked,
                         pages={page.content_sha256: page}, failures=[],
                         stats=BundleStats())  # fmt: skip
    assert plain.sources[0].retrieved is None and "checked" not in render_markdown(plain)


def test_batch_items_carry_their_own_freshness_contract() -> None:
    from webctx.jobs.batch_items import parse_items

    lines = ['{"id": 1, "question": "a", "max_age": 0, "stale_if_error": true}',
             '{"id": 2, "question": "b"}']  # fmt: skip
    first, second = parse_items(lines)
    assert (first.request.max_age, first.request.stale_if_error) == (0, True)
    assert (second.request.max_age, second.request.stale_if_error) == (None, False)


def test_a_batch_digest_changes_with_max_age_but_not_for_items_without_it() -> None:
    import hashlib
    import json

    from webctx.jobs.batch_items import items_sha, parse_items

    (plain,) = parse_items(['{"id": "q", "question": "a"}'])
    before = [plain.id, plain.request.model_dump(exclude={"max_age", "stale_if_error", "depth"})]
    digest = hashlib.sha256(json.dumps(before, sort_keys=True).encode() + b"\n").hexdigest()
    assert items_sha([plain]) == digest  # as computed before the fields existed
    (fresher,) = parse_items(['{"id": "q", "question": "a", "max_age": 0}'])
    assert items_sha([fresher]) != digest
