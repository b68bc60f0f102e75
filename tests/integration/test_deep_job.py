"""A `depth=deep` job end to end: real Celery workers, real Redis, the loopback web. The
answer to the question's second half sits on a page that no search finds, reachable only
as a same-site link of a page the first round fetched: `fast` misses it, `deep` follows
the link and cites it, and a same-site link that redirects to a forbidden address is
refused by the fetch guard, never fetched."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from mcp import Client, StdioServerParameters

from tests.conftest import ROOT, clean_env, redis_url, run_cli
from tests.testweb import LoopbackWeb, start_test_web
from webctx.devweb.site import SitePage
from webctx.models import Bundle

FIRST = "When was the Velmora harbour lighthouse built?"
SECOND = "Who tended the beacon lamps during the great storm?"
QUESTION = f"{FIRST} {SECOND}"
ANSWER = "Orrin Tallis"
HARBOUR = (
    "<html><head><title>Velmora harbour lighthouse</title></head><body>"
    "<nav><a href='/deep/beacon-storm.html'>Beacon lamps in the great storm</a> "
    "<a href='/deep/storm-mirror.html'>The great storm beacon (mirror)</a> "
    "<a href='http://127.0.0.2:9/deep/beacon-storm.html'>Beacon lamps storm elsewhere</a> "
    "<a href='/deep/tide-tables.html'>Tide tables</a></nav>"
    "<article><h1>Velmora harbour lighthouse</h1>"
    "<p>The Velmora harbour lighthouse was built in 1871 on the northern breakwater of "
    "the Velmora harbour. Its granite tower rises thirty metres above the quay, and the "
    "harbour lighthouse replaced a timber light that had stood there since 1820.</p>"
    "<p>Masons from the Velmora quarry cut the granite for the harbour lighthouse over "
    "three summers; the tower was built in 1871 and painted white in 1902.</p>"
    "</article></body></html>"
)
STORM = (
    "<html><head><title>The great storm of 1894</title></head><body><article>"
    "<h1>The great storm of 1894</h1>"
    f"<p>During the great storm of 1894 the beacon lamps were tended by {ANSWER}, who "
    "climbed the stair every hour of the night to trim the wicks and clean the glass "
    "while the sea broke over the breakwater. The beacon lamps never went dark.</p>"
    "<p>The harbour board gave the keeper a silver watch for tending the lamps through "
    "the storm, and the story of that night is still told on the quay.</p>"
    "</article></body></html>"
)
TIDES = (
    "<html><body><article><p>" + "Tide tables for the quay. " * 20 + "</p></article></body></html>"
)
EXTRA = {
    "/deep/harbour.html": (SitePage(body=HARBOUR), "Velmora harbour lighthouse",
                           "Velmora harbour lighthouse built 1871 granite tower breakwater"),
    "/deep/beacon-storm.html": (SitePage(body=STORM), "The great storm", ""),  # no search finds it
    "/deep/storm-mirror.html": (SitePage(body="", status=302,
                                         redirect_to="http://127.0.0.2:9/deep/beacon-storm.html"),
                                "mirror", ""),
    "/deep/tide-tables.html": (SitePage(body=TIDES), "Tide tables", ""),
}  # fmt: skip
# The test web's 3 s fetch deadline is for its hostile pages; on a loaded machine a page
# of the second round could meet it, and the test would fail for the machine's sake.
SLOW_MACHINE = {"WEBCTX_FETCH__TOTAL_TIMEOUT_S": "15", "WEBCTX_FETCH__READ_TIMEOUT_S": "10"}
ARGS = ("--max-sources", "3", "--max-queries", "2", "--top-k", "20", "--token-budget", "1200")


@pytest.fixture(scope="module")
def deep_web() -> Iterator[LoopbackWeb]:
    web = start_test_web(extra=EXTRA)
    yield web
    web.stop()


def _research(env: dict[str, str], depth: str) -> Bundle:
    done = run_cli(env, "research", QUESTION, "--format", "json", "--depth", depth, *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    return Bundle.model_validate_json(done.stdout)


def _text(bundle: Bundle) -> str:
    return " ".join(c.text for c in bundle.chunks)


def test_deep_job_follows_a_same_site_link_that_fast_never_fetches(
    deep_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(**{**deep_web.env(), **SLOW_MACHINE}, CELERY_BROKER_URL=redis_url(),
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"))  # fmt: skip
    start_worker(env)
    site = deep_web.site.url
    fast = _research(env, "fast")
    assert site + "/deep/harbour.html" in {s.url for s in fast.sources}
    assert ANSWER not in _text(fast) and deep_web.hits["/deep/beacon-storm.html"] == 0
    assert fast.stats.rounds == []  # fast: one round, as before depth existed

    deep = _research(env, "deep")
    assert ANSWER in _text(deep), (deep.failures, deep.stats.rounds)
    cited = {s.url for s in deep.sources}
    assert site + "/deep/beacon-storm.html" in cited and site + "/deep/harbour.html" in cited
    assert deep_web.hits["/deep/beacon-storm.html"] == 1
    assert deep_web.hits["/deep/tide-tables.html"] == 0  # its anchor shares no facet word
    # The same-site link that redirects to a forbidden address: the guard refused the hop.
    refused = {f.url: f for f in deep.failures}
    assert refused[site + "/deep/storm-mirror.html"].reason == "blocked", refused
    assert not any("127.0.0.2" in url for url in cited | set(refused))  # off-site: not followed
    first, second = deep.stats.rounds[:2]
    assert first.round == 1 and SECOND in first.missing and FIRST not in first.missing
    assert second.round == 2 and second.links == 2 and second.pages >= 2
    assert second.facets == [SECOND] and second.new_chunks > 0 and second.seconds > 0
    assert deep.stats.rounds[-1].stopped  # why the job stopped deepening


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_web_context_with_depth_deep_runs_the_further_round(
    deep_web: LoopbackWeb, tmp_path: Path, anyio_backend: str
) -> None:
    env = clean_env(**{**deep_web.env(), **SLOW_MACHINE}, WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "webctx.cli", "mcp"], env=env, cwd=str(ROOT)
    )
    args = {"question": QUESTION, "max_sources": 3, "max_queries": 2, "top_k": 20,
            "token_budget": 1200, "wait_s": 110, "depth": "deep"}  # fmt: skip
    async with Client(params, read_timeout_seconds=150) as client:
        result = await client.call_tool("web_context", args)
    assert not result.is_error, result.content
    bundle = Bundle.model_validate(result.structured_content)
    assert ANSWER in _text(bundle)
    assert [r.round for r in bundle.stats.rounds][:2] == [1, 2]
