"""A research job through the CLI (a real Celery worker, httpx, trafilatura, the openai
client and the Qdrant engine) over a loopback web whose pages hide instructions for the
model: nothing hidden reaches the bundle, visible instructions arrive flagged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_cli
from tests.untrusted_web import untrusted_pages
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.devweb.embeddings import make_embeddings_app
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.models import Bundle
from webctx.stages.bundle import render_markdown

MODEL = "hash-embedding"
QUESTION = "Zorbel reactor Ostrava plant kelvin"
PAGES = untrusted_pages()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[LoopbackServer, LoopbackServer, LoopbackServer]]:
    site = LoopbackServer(make_site_app({p: SitePage(html) for p, (html, _) in PAGES.items()}))
    site.start()
    docs = [SearchDoc(site.url + path, path, QUESTION) for path in PAGES]
    search = LoopbackServer(make_searxng_app(docs)).start()
    embed = HashEmbedder(model=MODEL).vectors
    embeddings = LoopbackServer(make_embeddings_app(embed, model=MODEL, rpm=None, tpm=None))
    embeddings.start()
    yield site, search, embeddings
    for server in (site, search, embeddings):
        server.stop()


@pytest.mark.slow
def test_a_job_over_pages_that_hide_instructions_quotes_none_and_flags_the_visible(
    servers: tuple[LoopbackServer, LoopbackServer, LoopbackServer], tmp_path: Path
) -> None:
    site, search, embeddings = servers
    env = clean_env(
        WEBCTX_SEARCH_PROVIDER="searxng",
        WEBCTX_SEARXNG_URL=search.url,
        OPENAI_BASE_URL=embeddings.url + "/v1",
        OPENAI_API_KEY="test-key",
        WEBCTX_EMBEDDING_MODEL=MODEL,
        WEBCTX_ALLOWED_NETWORKS="127.0.0.1/32",
        WEBCTX_FETCH__PER_HOST_DELAY_S="0",
        WEBCTX_FETCH__RESPECT_ROBOTS="false",
        WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"),
    )
    done = run_cli(env, "research", QUESTION, "--max-sources", "30", "--top-k", "200",
                   "--token-budget", "20000", timeout_s=150)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Bundle.model_validate_json(done.stdout)
    assert not bundle.failures and bundle.stats.fetched == len(PAGES)
    for text in (done.stdout, render_markdown(bundle)):
        assert "HIDDEN" not in text and "bonds to everyone" not in text
        assert not any(0xE0000 <= ord(c) <= 0xE007F or c in "\u200b\u00ad" for c in text)
    addressing = [c for c in bundle.chunks if "nstructions" in c.text or "AI assistant" in c.text]
    assert addressing and all(c.flags == ["instructions"] for c in addressing)
    assert bundle.stats.flagged_chunks == sum(1 for c in bundle.chunks if c.flags)
    assert all(s.flags == ["instructions"] for s in bundle.sources if "AI assistants" in s.title)
    # Pages share their article text, so near-duplicates are dropped: some facts, not all,
    # make the bundle (tests/unit/test_untrusted_web.py finds every one in the pages).
    assert {f"FACT{n}." for _, n in PAGES.values()} & {
        w for c in bundle.chunks for w in c.text.split()
    }
