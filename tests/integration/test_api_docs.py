"""The API's docs pages in a real browser: the system's headless Chromium, driven by
Playwright (no browser download), renders /docs and /redoc from the API's own assets with
every request kept on loopback, and a "Try it out" call authorized with a real key (made
by the key store on the test Redis) answers 200."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
import redis
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright

from tests.conftest import clean_env, redis_url
from tests.integration.conftest import ApiProcess
from webctx.jobs.tenants import TenantStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: apt-get install chromium"),
    pytest.mark.xdist_group("api_docs"),
]
# The browser resolves no name (its own lookups would leave loopback): only 127.0.0.1 connects.
CHROMIUM_ARGS = ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
WAIT_MS = 30_000


@dataclass
class DocsApi:
    """A `webctx api` process (no worker: the routes used here read Redis) and a key."""

    url: str
    key: str


@dataclass
class Requests:
    """Every request a page made (those bound beyond loopback aborted, not sent), and the
    browser's console: what the pages' Content-Security-Policy refused shows there."""

    seen: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def docs_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsApi]:
    tmp = tmp_path_factory.mktemp("docs")
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp / "q"))
    api = ApiProcess(env, tmp / "api.log")
    try:
        api.wait_ready(timeout_s=90)
        yield DocsApi(url=api.url, key=TenantStore(client).create_key("alpha")[0])
    finally:
        api.stop()
        client.flushdb()
        client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[tuple[Page, Requests]]:
    """A fresh browser context whose requests are recorded; non-loopback ones aborted."""
    requests = Requests()

    def guard(route: Route) -> None:
        url = route.request.url
        requests.seen.append(url)
        if urlsplit(url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            requests.blocked.append(url)
            route.abort()

    context = browser.new_context()
    context.route("**/*", guard)
    tab = context.new_page()
    tab.on("console", lambda message: requests.console.append(message.text))
    try:
        yield tab, requests
    finally:
        context.close()


def test_swagger_ui_renders_offline_and_try_it_out_succeeds_with_a_key(
    docs_api: DocsApi, page: tuple[Page, Requests]
) -> None:
    tab, requests = page
    tab.goto(docs_api.url + "/docs")
    operation = tab.locator("#operations-index-list_sources_v1_sources_get")
    expect(operation).to_be_visible(timeout=WAIT_MS)
    assert tab.locator(".opblock").count() >= 12
    assert tab.locator("button.authorize").count() >= 1

    operation.locator(".opblock-summary").click()
    operation.locator("button.try-out__btn").click()
    status = operation.locator(".live-responses-table tr.response .response-col_status")

    operation.locator("button.execute").click()  # no key yet
    expect(status).to_have_text("401", timeout=WAIT_MS)

    tab.locator(".auth-wrapper button.authorize").click()
    dialog = tab.locator(".modal-ux")
    dialog.locator("input").fill(docs_api.key)
    dialog.locator("button.authorize").click()
    dialog.locator("button.btn-done").click()

    operation.locator("button.btn-clear").click()
    operation.locator("button.execute").click()
    expect(status).to_have_text("200", timeout=WAIT_MS)
    assert requests.blocked == []
    assert not [m for m in requests.console if "Content Security Policy" in m]
    assert any(u.endswith("/openapi.json") for u in requests.seen)


def test_redoc_renders_offline(docs_api: DocsApi, page: tuple[Page, Requests]) -> None:
    tab, requests = page
    tab.goto(docs_api.url + "/redoc")
    operation = tab.locator('[data-section-id="operation/list_sources_v1_sources_get"]')
    expect(operation).to_be_attached(timeout=WAIT_MS)
    expect(tab.get_by_text("bearerAuth").first).to_be_attached()
    assert requests.blocked == []
    # ReDoc's sidebar shows a logo from its CDN: the policy stops it before any request.
    refused = [m for m in requests.console if "cdn.redoc.ly" in m]
    assert refused and all("Content Security Policy" in m for m in refused), requests.console
