"""The freshness contract end to end: `webctx research` with a real worker on the test
Redis against a loopback site of three pages whose bodies and statuses the test changes.
The site counts every request and answers a matching If-None-Match with 304."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.testweb import MODEL, LoopbackWeb
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.demo.web import load_corpus
from webctx.devweb.embeddings import make_embeddings_app
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.models import Bundle

QUESTION = "how do lithium-ion batteries degrade?"
TOPIC = "battery degradation lithium-ion ageing"


class SmallWeb(LoopbackWeb):
    """The loopback web over `pages`, a dict the test may change while it serves."""

    pages: dict[str, SitePage]

    def page_hits(self) -> dict[str, int]:
        """Requests per page path so far (robots.txt and tdmrep.json left out)."""
        return {p: n for p, n in self.hits.items() if p in self.pages}


@pytest.fixture
def small_web() -> Iterator[SmallWeb]:
    corpus = [p for p in load_corpus() if "batter" in p.html.lower()][:3]
    pages = {p.path: SitePage(p.html) for p in corpus}
    hits: collections.Counter[str] = collections.Counter()
    not_modified: collections.Counter[str] = collections.Counter()
    site = LoopbackServer(make_site_app(pages, hits=hits, not_modified=not_modified)).start()
    search = LoopbackServer(
        make_searxng_app([SearchDoc(site.url + path, path, TOPIC) for path in pages])
    ).start()
    embed = HashEmbedder(model=MODEL).vectors
    embeddings = LoopbackServer(make_embeddings_app(embed, model=MODEL, rpm=None, tpm=None))
    web = SmallWeb(site, search, embeddings.start(), hits=hits, not_modified=not_modified)
    web.pages = pages
    yield web
    web.stop()


def _research(env: dict[str, str], *args: str) -> Bundle:
    done = run_cli(env, "research", QUESTION, "--max-sources", "3", "--top-k", "200",
                   "--token-budget", "20000", *args)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return Bundle.model_validate_json(done.stdout)


def _retrieved(bundle: Bundle, web: SmallWeb) -> dict[str, str | None]:
    return {s.url.removeprefix(web.site.url): s.retrieved for s in bundle.sources}


@pytest.mark.slow
def test_max_age_picks_cached_live_or_revalidated_and_stale_if_error_is_opt_in(
    small_web: SmallWeb,
    tmp_path: Path,
    redis_client: redis.Redis,
    start_worker: Callable[..., object],
) -> None:
    web, paths = small_web, sorted(small_web.pages)
    env = clean_env(**web.env(), CELERY_BROKER_URL=redis_url(),
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"))  # fmt: skip
    start_worker(env, "-c", "2")

    first = _research(env)
    assert _retrieved(first, web) == dict.fromkeys(paths, "live")
    assert web.page_hits() == dict.fromkeys(paths, 1)
    assert all(s.checked_at is not None and not s.stale for s in first.sources)

    # Broker mode's interactive jobs download anew by default; a max_age within the
    # page-cache window takes the cached copies: no page is downloaded again.
    second = _research(env, "--max-age", "3600")
    assert _retrieved(second, web) == dict.fromkeys(paths, "cached")
    assert web.page_hits() == dict.fromkeys(paths, 1)
    downloaded = {s.url: s.checked_at for s in first.sources}
    for source in second.sources:  # when the first job downloaded it (to the millisecond)
        downloaded_at = downloaded[source.url]
        assert source.checked_at is not None and downloaded_at is not None
        assert abs((source.checked_at - downloaded_at).total_seconds()) < 0.01

    # max_age=0, and broker mode's default: every page downloaded, without validators.
    third = _research(env, "--max-age", "0")
    assert _retrieved(third, web) == dict.fromkeys(paths, "live")
    assert web.page_hits() == dict.fromkeys(paths, 2)
    assert sum(web.not_modified.values()) == 0
    assert all(s.checked_at and s.checked_at > second.created_at for s in third.sources)
    default = _research(env)
    assert _retrieved(default, web) == dict.fromkeys(paths, "live")
    assert web.page_hits() == dict.fromkeys(paths, 3)

    # Past a 1 s max_age: conditional GETs; the changed page comes back whole.
    changed = paths[0]
    edited = web.pages[changed].body_bytes().replace(b"</p>", b" Edited today.</p>", 1)
    web.pages[changed] = SitePage(edited)
    time.sleep(1.2)
    fourth = _research(env, "--max-age", "1")
    assert _retrieved(fourth, web) == {p: "live" if p == changed else "revalidated" for p in paths}
    assert web.not_modified == collections.Counter({p: 1 for p in paths if p != changed})
    assert web.page_hits() == dict.fromkeys(paths, 4)

    # A page failing live: a failure, unless stale_if_error lets the old copy stand in.
    failing = paths[1]
    web.pages[failing] = SitePage(body="oops", status=500)
    strict = _research(env, "--max-age", "0")
    assert failing not in _retrieved(strict, web)
    assert [f.url.removeprefix(web.site.url) for f in strict.failures] == [failing]
    lenient = run_cli(env, "research", QUESTION, "--max-sources", "3", "--top-k", "200",
                      "--token-budget", "20000", "--max-age", "0", "--stale-if-error",
                      "--format", "markdown")  # fmt: skip
    assert lenient.returncode == 0, lenient.stderr[-3000:]
    assert "STALE: live fetch failed (http_status)" in lenient.stdout
    as_json = _research(env, "--max-age", "0", "--stale-if-error")
    (stale,) = [s for s in as_json.sources if s.stale]
    assert stale.url == web.site.url + failing and stale.retrieved == "cached"
    assert stale.stale_reason == "http_status" and as_json.failures == []

    # max_age=-1: stored copies only, nothing downloaded (the failing page's included).
    before = web.page_hits()
    cache_only = _research(env, "--max-age", "-1")
    assert _retrieved(cache_only, web) == dict.fromkeys(paths, "cached")
    assert web.page_hits() == before
