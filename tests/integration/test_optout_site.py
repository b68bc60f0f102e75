"""Publishers' opt-outs, black box: research jobs through the CLI (embedded default) and a
re-index run over a loopback site with a page for each opt-out form and allowed controls,
and the User-Agent every kind of request carries."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.optout_web import (
    FORMS,
    QUESTION,
    ROBOTS_BLOCKED,
    USER_AGENT,
    article,
    marker,
    optout_pages,
)
from webctx.adapters.browser import ChromiumRenderer, find_browser
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.devweb.embeddings import make_embeddings_app
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app, script_shell_pages
from webctx.index.page_records import PageRecords
from webctx.index.refresh import IndexContext, refresh_source
from webctx.index.sources import SourceRegistry
from webctx.jobs.caches import StoredPages
from webctx.models import Bundle
from webctx.net.addresses import AddressPolicy
from webctx.net.politeness import Politeness
from webctx.settings import (
    ChunkSettings,
    EmbedSettings,
    FetchSettings,
    IndexSettings,
    RenderSettings,
)
from webctx.stages.bundle import render_markdown

MODEL = "hash-embedding"
REFUSED = {path: form.rule for path, form in FORMS.items() if form.rule}
ALLOWED = [path for path, form in FORMS.items() if not form.rule]
LOOPBACK = AddressPolicy(allowed_networks=["127.0.0.1/32"])


@dataclass
class Web:
    site: LoopbackServer
    search: LoopbackServer
    embeddings: LoopbackServer
    pages: dict[str, SitePage]
    agents: list[tuple[str, str]]


@pytest.fixture(scope="module")
def web() -> Iterator[Web]:
    pages, agents = optout_pages(), []
    site = LoopbackServer(make_site_app(pages, agents=agents)).start()
    docs = [SearchDoc(site.url + path, path, QUESTION) for path in [*FORMS, ROBOTS_BLOCKED]]
    search = LoopbackServer(make_searxng_app(docs)).start()
    embed = HashEmbedder(model=MODEL).vectors
    embeddings = LoopbackServer(make_embeddings_app(embed, model=MODEL, rpm=None, tpm=None))
    embeddings.start()
    yield Web(site, search, embeddings, pages, agents)
    for server in (site, search, embeddings):
        server.stop()


def research(web: Web, tmp_path: Path, **extra: str) -> tuple[Bundle, str]:
    env = clean_env(
        WEBCTX_SEARCH_PROVIDER="searxng", WEBCTX_SEARXNG_URL=web.search.url,
        OPENAI_BASE_URL=web.embeddings.url + "/v1", OPENAI_API_KEY="test-key",
        WEBCTX_EMBEDDING_MODEL=MODEL, WEBCTX_ALLOWED_NETWORKS="127.0.0.1/32",
        WEBCTX_FETCH__PER_HOST_DELAY_S="0", WEBCTX_FETCH__USER_AGENT=USER_AGENT,
        WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"), **extra,
    )  # fmt: skip
    done = run_cli(env, "research", QUESTION, "--max-sources", "30", "--top-k", "200",
                   "--token-budget", "20000", timeout_s=150)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return Bundle.model_validate_json(done.stdout), done.stdout


@pytest.mark.slow
def test_opted_out_pages_fail_with_their_rule_and_no_text_of_theirs_is_bundled(
    web: Web, tmp_path: Path
) -> None:
    web.agents.clear()
    bundle, raw = research(web, tmp_path)
    failures = {f.url.removeprefix(web.site.url): f for f in bundle.failures}
    for path, rule in REFUSED.items():
        assert (failures[path].reason, failures[path].error) == ("opted_out", rule), path
    blocked = failures[ROBOTS_BLOCKED]  # robots.txt names its line, matched as `webctx`
    assert blocked.reason == "blocked" and "line 5: Disallow: /robots-blocked" in blocked.error
    markdown = render_markdown(bundle)
    for path in [*REFUSED, ROBOTS_BLOCKED]:
        assert marker(path) not in raw and marker(path) not in markdown, path
    used = {s.url.removeprefix(web.site.url) for s in bundle.sources}
    assert used == set(ALLOWED)  # the controls, `noindex` too (a one-off job may read it)
    assert all(s.opt_out is None for s in bundle.sources)
    # Every request the job sent carried the configured User-Agent, hence the token.
    kinds = {path for path, _ in web.agents}
    assert {"/robots.txt", "/.well-known/tdmrep.json", "/allowed"} <= kinds
    assert {agent for _, agent in web.agents} == {USER_AGENT}


@pytest.mark.slow
def test_report_only_mode_uses_opted_out_pages_and_marks_them(web: Web, tmp_path: Path) -> None:
    bundle, _ = research(web, tmp_path, WEBCTX_FETCH__OPT_OUTS="report")
    assert {f.url.removeprefix(web.site.url) for f in bundle.failures} == {ROBOTS_BLOCKED}
    marks = {s.url.removeprefix(web.site.url): s.opt_out for s in bundle.sources}
    assert {p: m for p, m in marks.items() if m} == REFUSED
    markdown = render_markdown(bundle)
    assert "publisher opted out: X-Robots-Tag: noai (reported, not honoured)" in markdown


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_the_index_keeps_out_noindex_and_reserved_pages_and_every_request_names_webctx(
    web: Web, r: redis.Redis
) -> None:
    paths = ["/allowed", "/noindex", "/xrt-noai", "/private/tdm-file", "/xrt-other-bot"]
    urls = "".join(f"<url><loc>{web.site.url}{p}</loc></url>" for p in paths)
    web.pages["/sitemap.xml"] = SitePage(
        f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"{urls}</urlset>", content_type="application/xml",
    )  # fmt: skip
    settings = FetchSettings(user_agent=USER_AGENT, per_host_delay_s=0.0, total_timeout_s=10.0)
    fetcher = HttpxFetcher(settings, policy=LOOPBACK,
                           politeness=Politeness.from_settings(settings))  # fmt: skip
    ctx = IndexContext(
        records=PageRecords(r), stored_pages=StoredPages(r, ttl_s=60, scope=["s"]),
        fetcher=fetcher, embedder=HashEmbedder(model=MODEL), store=MemoryVectorStore(),
        chunking=ChunkSettings(), embedding=EmbedSettings(),
        settings=IndexSettings(grace_s=0.0, concurrency=2), fetch=settings,
    )  # fmt: skip
    source = SourceRegistry(r).add("acme", web.site.url + "/sitemap.xml", every_s=3600)
    web.agents.clear()
    try:
        first = refresh_source(source, ctx)
        assert (first.outcomes["added"], first.outcomes["opted_out"]) == (2, 3)
        indexed = {p for p in paths if ctx.records.get("acme", web.site.url + p)}
        assert indexed == {"/allowed", "/xrt-other-bot"}
        # A page that gains `noindex` leaves the index; the other is revalidated (304).
        gained = SitePage(article("/allowed", 2), headers={"X-Robots-Tag": "none"})
        web.pages["/allowed"] = gained
        second = refresh_source(source, ctx)
        assert (second.outcomes["not_modified"], second.outcomes["opted_out"]) == (1, 4)
        assert ctx.records.get("acme", web.site.url + "/allowed") is None
    finally:
        fetcher.close()
        web.pages["/allowed"] = optout_pages()["/allowed"]
    kinds = collections.Counter(path for path, _ in web.agents)
    assert kinds["/sitemap.xml"] == 2 and kinds["/xrt-other-bot"] == 2  # a revalidation too
    assert kinds["/robots.txt"] == 1 and kinds["/.well-known/tdmrep.json"] == 1
    assert {agent for _, agent in web.agents} == {USER_AGENT}


BROWSER = find_browser()


@pytest.mark.skipif(BROWSER is None, reason="no Chromium or no Playwright")
def test_the_browser_sends_the_configured_user_agent(web: Web) -> None:
    web.pages.update(script_shell_pages("/spa/valve", "Quillon valve", ["Unit 7 opens."] * 3))
    assert BROWSER is not None
    chromium = ChromiumRenderer(RenderSettings(), FetchSettings(user_agent=USER_AGENT),
                                executable=BROWSER, policy=LOOPBACK)  # fmt: skip
    web.agents.clear()
    try:
        chromium.render(web.site.url + "/spa/valve")
    finally:
        chromium.close()
    assert {"/spa/valve", "/spa/valve.js"} <= {path for path, _ in web.agents}
    assert {agent for _, agent in web.agents} == {USER_AGENT}
