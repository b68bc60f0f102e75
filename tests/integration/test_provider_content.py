"""Keyed search providers through a real job (real Redis, a `webctx worker` process, the
loopback web): a chain whose first provider fails hands every query to the second, the
bundle's stats name each query's provider; a page whose download answers 503 is cited
from the provider's text (`retrieved: "provider"`, its own hash, its spans verified
against that text); a page robots.txt refuses is never taken from the provider."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.testweb import MODEL
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.devweb.embeddings import make_embeddings_app
from webctx.devweb.searxng import SearchDoc
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.devweb.vendors import VendorControl, make_vendor_app, vendor_control
from webctx.models import Bundle
from webctx.stages.visibility import strip_invisible

KEY = "vendor-key"
QUESTION = "why do alpine glaciers retreat in warm summers?"
ROBOTS = "User-agent: *\nDisallow: /private.html\n"


def _para(topic: str, n: int) -> str:
    return (f"Alpine glaciers retreat when warm summers melt more ice than winter snow adds; "
            f"{topic} observation {n} measured the glacier front moving uphill each year, "
            "and the meltwater raised the lake below the glacier tongue.")  # fmt: skip


def _article(title: str, topic: str) -> str:
    body = "".join(f"<p>{_para(topic, n)}</p>" for n in range(6))
    return (f"<html><head><title>{title}</title></head><body><article><h1>{title}</h1>"
            f"{body}</article></body></html>")  # fmt: skip


DOWN_TEXT = " ".join(_para("the provider's copy of the station report", n) for n in range(5))
PRIVATE_TEXT = "PRIVATEMARKER " + " ".join(_para("the private survey", n) for n in range(5))


@dataclass
class Web:
    site: LoopbackServer
    vendors: dict[str, tuple[LoopbackServer, VendorControl]]
    embeddings: LoopbackServer

    def env(self, chain: str) -> dict[str, str]:
        env = {"WEBCTX_SEARCH_PROVIDER": chain, "OPENAI_BASE_URL": self.embeddings.url + "/v1",
               "OPENAI_API_KEY": "test-key", "WEBCTX_EMBEDDING_MODEL": MODEL,
               "WEBCTX_ALLOWED_NETWORKS": "127.0.0.1/32", "WEBCTX_FETCH__TOTAL_TIMEOUT_S": "3",
               "WEBCTX_FETCH__READ_TIMEOUT_S": "2",
               "WEBCTX_FETCH__PER_HOST_DELAY_S": "0"}  # fmt: skip
        for vendor, (server, _) in self.vendors.items():
            env[f"{vendor.upper()}_API_KEY"] = KEY
            env[f"WEBCTX_{vendor.upper()}__BASE_URL"] = server.url
        return env


@pytest.fixture(scope="module")
def web() -> Iterator[Web]:
    pages = {f"/{name}.html": SitePage(_article(f"Glacier {name}", name))
             for name in ("moraine", "icefield", "cirque")}  # fmt: skip
    pages["/down.html"] = SitePage("upstream unavailable", status=503, content_type="text/plain")
    pages["/private.html"] = SitePage(_article("Private survey", "private"))
    pages["/robots.txt"] = SitePage(ROBOTS, content_type="text/plain")
    site = LoopbackServer(make_site_app(pages)).start()
    docs = [SearchDoc(site.url + f"/{n}.html", f"Glacier {n}", _para(n, 0) * 3)
            for n in ("moraine", "icefield", "cirque")]  # fmt: skip
    docs.append(SearchDoc(site.url + "/down.html", "Glacier station report", DOWN_TEXT))
    docs.append(SearchDoc(site.url + "/private.html", "Private survey", PRIVATE_TEXT))
    vendors = {}
    for vendor in ("brave", "tavily", "exa"):
        app = make_vendor_app(vendor, docs, api_key=KEY)
        vendors[vendor] = (LoopbackServer(app).start(), vendor_control(app))
    embed = HashEmbedder(model=MODEL).vectors
    embeddings = LoopbackServer(make_embeddings_app(embed, model=MODEL, rpm=None, tpm=None))
    web = Web(site, vendors, embeddings.start())
    yield web
    for server in (site, embeddings, *(s for s, _ in vendors.values())):
        server.stop()


def _research(env: dict[str, str]) -> Bundle:
    done = run_cli(env, "research", QUESTION, "--format", "json", "--max-sources", "8",
                   "--top-k", "20", "--token-budget", "4000", timeout_s=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return Bundle.model_validate_json(done.stdout)


def _spans_verified(bundle: Bundle, source_url: str, text: str) -> int:
    [source] = [s for s in bundle.sources if s.url == source_url]
    assert source.content_sha256 == hashlib.sha256(text.encode()).hexdigest()
    chunks = [c for c in bundle.chunks if c.source == source.id]
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
    return len(chunks)


@pytest.mark.parametrize("vendor", ["tavily", "exa"])
def test_a_page_answering_503_is_cited_from_the_providers_text(
    web: Web, vendor: str, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(**web.env(vendor), CELERY_BROKER_URL=redis_url(),
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"))  # fmt: skip
    start_worker(env)
    bundle = _research(env)
    down = web.site.url + "/down.html"
    by_url = {s.url: s for s in bundle.sources}
    assert by_url[down].retrieved == "provider", by_url[down]
    assert all(s.retrieved == "live" for u, s in by_url.items() if u != down)
    assert _spans_verified(bundle, down, strip_invisible(DOWN_TEXT.strip())) >= 1
    assert bundle.stats.from_provider == 1
    assert down not in {f.url for f in bundle.failures}
    # robots.txt refuses /private.html: a failure, never the provider's text
    private = web.site.url + "/private.html"
    assert private not in by_url
    [refused] = [f for f in bundle.failures if f.url == private]
    assert refused.reason == "blocked" and "robots.txt" in refused.error
    assert not any("PRIVATEMARKER" in c.text for c in bundle.chunks)
    assert set(bundle.stats.query_providers) == {vendor}


def test_a_chain_hands_every_query_on_past_a_failing_provider(
    web: Web, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    brave, tavily = web.vendors["brave"][1], web.vendors["tavily"][1]
    brave.fail_always(fault="server")
    try:
        env = clean_env(**web.env("brave,tavily"), CELERY_BROKER_URL=redis_url(),
                        WEBCTX_QDRANT_PATH=str(tmp_path / "q"))  # fmt: skip
        start_worker(env)
        sent_before = tavily.requests
        bundle = _research(env)
    finally:
        brave.recover()
    queries = len(bundle.queries)
    assert bundle.stats.query_providers == ["tavily"] * queries
    assert bundle.stats.search_requests["tavily"] == queries == tavily.requests - sent_before
    assert 1 <= bundle.stats.search_requests.get("brave", 0) <= queries
    assert not [f for f in bundle.failures if f.stage == "search"]
    assert bundle.sources and bundle.chunks
