"""Pages rendered by script: the system's Chromium behind the fetch guard, and a research
job citing a single-page app's shell, in the embedded default and on a render worker."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.testweb import LoopbackWeb, start_test_web
from webctx.adapters.browser import ChromiumRenderer, find_browser
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app, script_shell_pages
from webctx.errors import BlockedURL
from webctx.models import Bundle
from webctx.net.addresses import AddressPolicy
from webctx.settings import FetchSettings, RenderSettings

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium (apt-get install chromium) or no Playwright"
)

SHELL_PATH = "/spa/cold-weather-range"
SHELL_TITLE = "Cold weather and electric car range"
SHELL_TEXT = [
    "In freezing weather an electric car loses range because the cabin heater and the "
    "battery heater draw power, and because a cold lithium-ion cell delivers less energy.",
    "Preconditioning the battery while the car is still plugged in recovers most of the "
    "lost winter range; a heat pump halves the heating load compared with a resistive heater.",
    "Below minus ten degrees Celsius, fast charging slows down sharply: the car limits the "
    "current until the pack is warm, to avoid lithium plating on the anode.",
]
QUESTION = "why does cold winter weather reduce electric car range and preconditioning?"


class Listener:
    """A TCP listener on 127.0.0.2 (a forbidden loopback alias) counting what it accepts."""

    def __init__(self) -> None:
        self.accepted = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.2", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True, name="alias-listener").start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            with contextlib.suppress(OSError):
                conn.settimeout(1)
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                             b"Content-Length: 2\r\n\r\nok")  # fmt: skip
            conn.close()

    def close(self) -> None:
        self._sock.close()


def _escaping_page(alias: str) -> str:
    """A page that tries every way out to `alias`: script, image, iframe, fetch, XHR,
    websocket, a service worker, a beacon."""
    return f"""<html><head><title>Escapes</title><script src="http://{alias}/s.js"></script>
<link rel="stylesheet" href="http://{alias}/c.css"><link rel="prefetch" href="http://{alias}/p">
</head><body><img src="http://{alias}/i.png"><iframe src="http://{alias}/frame"></iframe>
<article><p>{"This page tries to reach a forbidden address in every way it can. " * 4}</p>
</article><script>
fetch("http://{alias}/fetch").catch(() => 0);
const x = new XMLHttpRequest(); x.open("GET", "http://{alias}/xhr"); x.send();
try {{ new WebSocket("ws://{alias}/ws"); }} catch (e) {{}}
navigator.sendBeacon && navigator.sendBeacon("http://{alias}/beacon", "x");
navigator.serviceWorker && navigator.serviceWorker.register("/sw.js").catch(() => 0);
</script></body></html>"""


def _leaving_page(alias: str) -> str:
    """A page that navigates itself to `alias` once loaded."""
    move = f'setTimeout(() => {{ location.href = "http://{alias}/away"; }}, 100);'
    return f"<html><body><p>{'Leaving soon. ' * 20}</p><script>{move}</script></body></html>"


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    alias = Listener()
    yield alias
    alias.close()


@pytest.fixture(scope="module")
def site(listener: Listener) -> Iterator[LoopbackServer]:
    alias = f"127.0.0.2:{listener.port}"
    pages = {
        "/escape.html": SitePage(body=_escaping_page(alias)),
        "/sw.js": SitePage(body="self.onfetch = () => 0;", content_type="text/javascript"),
        "/leave.html": SitePage(body=_leaving_page(alias)),
        "/away": SitePage(redirect_to=f"http://{alias}/redirected"),
        "/moved": SitePage(redirect_to=SHELL_PATH, status=301),
        **script_shell_pages(SHELL_PATH, SHELL_TITLE, SHELL_TEXT),
    }
    server = LoopbackServer(make_site_app(pages)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def renderer() -> Iterator[ChromiumRenderer]:
    assert BROWSER is not None
    policy = AddressPolicy(allowed_networks=["127.0.0.1/32"])
    chromium = ChromiumRenderer(
        RenderSettings(), FetchSettings(), executable=BROWSER, policy=policy
    )
    yield chromium
    chromium.close()


def test_rendered_shell_holds_the_text_its_script_wrote(
    renderer: ChromiumRenderer, site: LoopbackServer
) -> None:
    download = renderer.render(site.url + SHELL_PATH)
    assert SHELL_TEXT[1] in download.body.decode()
    assert download.final_url == site.url + SHELL_PATH


def test_redirect_is_followed_under_the_guard_and_the_frame_gets_the_final_url(
    renderer: ChromiumRenderer, site: LoopbackServer
) -> None:
    download = renderer.render(site.url + "/moved")
    assert download.final_url == site.url + SHELL_PATH
    assert SHELL_TEXT[0] in download.body.decode()


def test_rendered_page_opens_no_connection_to_a_forbidden_address(
    renderer: ChromiumRenderer, site: LoopbackServer, listener: Listener
) -> None:
    before = listener.accepted
    download = renderer.render(site.url + "/escape.html")
    assert "every way it can" in download.body.decode()
    with pytest.raises(BlockedURL):
        renderer.render(site.url + "/away")  # a redirect to the alias
    with pytest.raises(BlockedURL):
        renderer.render(site.url + "/leave.html")  # a script moving the page there
    with pytest.raises(BlockedURL):
        renderer.render(f"http://127.0.0.2:{listener.port}/direct")
    assert listener.accepted - before == 0


def test_a_browser_without_the_route_does_reach_the_alias(
    site: LoopbackServer, listener: Listener
) -> None:
    """The control: the listener counts what an unguarded browser sends it."""
    from playwright.sync_api import sync_playwright

    before = listener.accepted
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=BROWSER, headless=True)
        page = browser.new_page()
        with contextlib.suppress(Exception):
            page.goto(site.url + "/escape.html", wait_until="load", timeout=10_000)
            page.wait_for_timeout(1000)
        browser.close()
    assert listener.accepted - before > 0


# -- a research job citing the shell ----------------------------------------------------------
@pytest.fixture(scope="module")
def shell_web() -> Iterator[LoopbackWeb]:
    extra = {
        path: (page, SHELL_TITLE, " ".join(SHELL_TEXT) if path == SHELL_PATH else "")
        for path, page in script_shell_pages(SHELL_PATH, SHELL_TITLE, SHELL_TEXT).items()
    }
    web = start_test_web(extra=extra)
    yield web
    web.stop()


def _research(env: dict[str, str]) -> Bundle:
    done = run_cli(env, "research", QUESTION, "--format", "json", "--max-sources", "6",
                   "--top-k", "8", "--token-budget", "1500")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return Bundle.model_validate_json(done.stdout)


def _assert_shell_cited(bundle: Bundle, web: LoopbackWeb) -> None:
    shell = [s for s in bundle.sources if s.url == web.site.url + SHELL_PATH]
    assert shell, [f.model_dump() for f in bundle.failures]
    cited = [c.text for c in bundle.chunks if c.source == shell[0].id]
    assert cited and any(part in " ".join(SHELL_TEXT) for part in cited)


def test_research_embedded_default_cites_a_script_rendered_page(
    shell_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**shell_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"))
    _assert_shell_cited(_research(env), shell_web)


@pytest.mark.slow
def test_research_broker_mode_renders_on_a_render_worker(
    shell_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(**shell_web.env(), CELERY_BROKER_URL=redis_url(),
                    WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"))  # fmt: skip
    # The fetch worker has no browser of its own: it diverts to the render worker.
    no_browser = {"WEBCTX_RENDER__REMOTE": "true", "WEBCTX_RENDER__BROWSER": "no-such-browser"}
    start_worker({**env, **no_browser}, "-Q", "search,fetch,embed", "-n", "io@%h")
    start_worker(env, "-Q", "render", "-n", "render@%h")
    start_worker(env, "-Q", "store,rank", "-n", "vec@%h")
    _assert_shell_cited(_research(env), shell_web)


def test_without_a_browser_the_shell_fails_needs_render_with_a_hint(
    shell_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**shell_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"),
                    WEBCTX_RENDER__BROWSER="no-such-browser")  # fmt: skip
    bundle = _research(env)
    failed = {f.url: f for f in bundle.failures}
    failure = failed[shell_web.site.url + SHELL_PATH]
    assert failure.reason == "needs_render"
    assert "apt-get install chromium" in failure.error


def test_a_browser_over_its_memory_cap_is_restarted_between_pages(
    site: LoopbackServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert BROWSER is not None
    policy = AddressPolicy(allowed_networks=["127.0.0.1/32"])
    capped = ChromiumRenderer(RenderSettings(memory_mb=128), FetchSettings(),
                              executable=BROWSER, policy=policy)  # fmt: skip
    try:
        with caplog.at_level("INFO", logger="webctx.adapters.browser"):
            for _ in range(2):
                assert SHELL_TEXT[2] in capped.render(site.url + SHELL_PATH).body.decode()
        messages = [r.getMessage() for r in caplog.records]
        assert messages.count("browser restarted") == 2
        assert messages.count("browser started") == 2  # the second page launched a new one
    finally:
        capped.close()


def test_a_plain_worker_without_a_browser_serves_the_rest_and_says_so_in_one_line(
    redis_client: redis.Redis, start_worker, tmp_path: Path
) -> None:
    env = clean_env(
        CELERY_BROKER_URL=redis_url(),
        WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
        WEBCTX_EMBEDDING_PROVIDER="hash",
        WEBCTX_RENDER__BROWSER="no-such-browser",
    )
    worker = start_worker(env)  # every queue by default
    log = worker.log.read_text()
    lines = [line for line in log.splitlines() if "not consuming render" in line]
    assert len(lines) == 1 and "apt-get install chromium" in lines[0]
    consumed = log.split("[queues]", 1)[1].split("[tasks]", 1)[0]
    assert "fetch" in consumed and "render" not in consumed
