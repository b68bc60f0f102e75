"""The script-shell detector, and how extraction uses it: a shell needs a browser, a
challenge page stays blocked, an empty page without scripts stays an extraction failure."""

from __future__ import annotations

import pytest

from tests.fetch_site import ARTICLE
from webctx.devweb.site import script_shell_pages
from webctx.errors import BlockedURL, ExtractionError, NeedsRender
from webctx.models import Download
from webctx.stages.fetch import extract_page
from webctx.stages.shell import script_shell

_BUNDLE = '<script type="module" src="/assets/index-4f2a.js"></script>'
SHELLS = {
    "create-react-app": (
        "<!doctype html><html><head><title>App</title></head><body><noscript>You need to "
        'enable JavaScript to run this app.</noscript><div id="root"></div>'
        '<script src="/static/js/main.8c.js"></script></body></html>'
    ),
    "next-csr": (
        f'<html><head>{_BUNDLE}</head><body><div id="__next"></div>'
        '<script id="__NEXT_DATA__" type="application/json">{"props":{}}</script></body></html>'
    ),
    "angular": f"<html><head>{_BUNDLE}</head><body><app-root></app-root></body></html>",
    "vue-loading": (
        f'<html><head>{_BUNDLE}</head><body><div id="app"><p>Loading…</p></div></body></html>'
    ),
    "noscript-only": (
        "<html><body><noscript>Please turn on JavaScript.</noscript>"
        '<div class="shell"></div><script src="/bundle.js"></script></body></html>'
    ),
    "bare-bundle": '<html><body><main></main><script src="/app.js"></script></body></html>',
}


def _download(html: str) -> Download:
    return Download(url="https://example.org/a", final_url="https://example.org/a", status=200,
                    content_type="text/html", body=html.encode())  # fmt: skip


@pytest.mark.parametrize("name", sorted(SHELLS))
def test_empty_shells_filled_by_scripts_are_detected(name: str) -> None:
    assert script_shell(SHELLS[name]) is not None


@pytest.mark.parametrize(
    "html",
    [
        ARTICLE,  # an article: text in the body
        '<html><body><div id="root"></div></body></html>',  # no script: nothing will fill it
        "<html><body><p>short</p></body></html>",
        # server-rendered app: the mount node holds the text
        f'<html><head>{_BUNDLE}</head><body><div id="__next"><article>{"word " * 80}'
        "</article></div></body></html>",
        '<html><body><div id="root"></div><script type="application/ld+json">{}</script></body>',
        "",
    ],
)
def test_pages_with_text_or_without_scripts_are_not_shells(html: str) -> None:
    assert script_shell(html) is None


def test_extract_page_asks_for_a_browser_before_calling_a_noscript_shell_blocked() -> None:
    # The shell's <noscript> says "enable JavaScript": the interstitial check must not win.
    with pytest.raises(NeedsRender, match="rendered by script"):
        extract_page(_download(SHELLS["create-react-app"]))


def test_rendered_download_of_a_shell_fails_as_empty_instead_of_looping() -> None:
    with pytest.raises(ExtractionError):
        extract_page(_download(SHELLS["bare-bundle"]), rendered=True)


def test_challenge_page_with_scripts_stays_blocked() -> None:
    challenge = (
        "<html><head><title>Just a moment...</title></head><body><noscript>Enable JavaScript "
        'and cookies to continue</noscript><div id="root"></div>'
        '<script src="/cdn-cgi/challenge-platform/h/g/orchestrate/jsch/v1"></script></body></html>'
    )
    with pytest.raises(BlockedURL, match="interstitial"):
        extract_page(_download(challenge))


def test_devweb_shell_is_a_shell_and_its_bundle_writes_the_text() -> None:
    pages = script_shell_pages("/spa/care", "Battery care", ["Keep cells cool.", "Charge to 80 %."])
    shell = pages["/spa/care"].body_bytes().decode()
    assert script_shell(shell) == "mount node"
    assert "Keep cells cool." not in shell
    assert "Keep cells cool." in pages["/spa/care.js"].body_bytes().decode()
