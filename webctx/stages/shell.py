"""Does an HTML page look like an empty shell that its scripts fill in a browser?

Asked only after static extraction found no main text: a single-page app's server sends a
near-empty body (a mount node such as `<div id="root"></div>`, script bundles, perhaps a
`<noscript>` "enable JavaScript" notice), and the text exists only once a browser has run
the scripts. Such a page goes to the render queue instead of failing as empty or as an
"enable JavaScript" interstitial. Measured on the 181 pages of the extraction benchmark
(bench/shell_detector.py): no page whose static extraction succeeds looks like a shell.
"""

from __future__ import annotations

import re
from copy import deepcopy

from lxml.html import HtmlElement
from trafilatura.utils import load_html

SHELL_MAX_TEXT_CHARS = 300
"""Visible body text (scripts, styles and <noscript> left out) above this is content."""
_MOUNT_IDS = frozenset(
    {"root", "app", "__next", "__nuxt", "___gatsby", "svelte", "q-app", "app-root", "main-app",
     "react-root", "spa-root", "application"}
)  # fmt: skip
_MOUNT_ATTRIBUTES = ("data-reactroot", "ng-version", "ng-app", "data-v-app", "data-server-rendered")
_APP_TAGS = frozenset({"app-root"})  # Angular's default root element
_NOT_SHOWN = ("script", "style", "noscript", "template", "svg")
_NEEDS_JS = re.compile(r"javascript|\bjs\b", re.I)
_SPACE = re.compile(r"\s+")
_MOUNT_EMPTY_CHARS = 40


def script_shell(html: str) -> str | None:
    """Why `html` looks script-rendered ("mount node", "noscript notice", "script-only
    body"), or None. Pages without scripts, or with visible text, are never shells."""
    tree = load_html(html) if html else None
    if tree is None:
        return None
    body = tree.find(".//body")
    if body is None or not isinstance(body, HtmlElement):
        return None
    scripts = [s for s in tree.iter("script") if _is_script(s)]
    if not scripts:
        return None
    if len(_visible_text(body)) > SHELL_MAX_TEXT_CHARS:
        return None
    if _empty_mount(body):
        return "mount node"
    if any(_NEEDS_JS.search(n.text_content() or "") for n in body.iter("noscript")):
        return "noscript notice"
    shown = [c for c in body if isinstance(c.tag, str) and c.tag not in _NOT_SHOWN]
    if len(shown) <= 2 and any(s.get("src") for s in scripts):
        return "script-only body"
    return None


def _is_script(element: HtmlElement) -> bool:
    kind = (element.get("type") or "text/javascript").lower()
    return kind in ("module", "text/javascript", "application/javascript")


def _visible_text(body: HtmlElement) -> str:
    """The body's text without scripts, styles, <noscript>, templates and SVG."""
    copy = deepcopy(body)
    for element in list(copy.iter(*_NOT_SHOWN)):
        element.drop_tree()  # keeps its tail: text that follows it is shown
    return _SPACE.sub(" ", copy.text_content()).strip()


def _empty_mount(body: HtmlElement) -> bool:
    """True when the body holds a framework's mount node with (almost) nothing in it."""
    for element in body.iter():
        if not isinstance(element.tag, str):
            continue
        is_mount = (
            (element.get("id") or "").lower() in _MOUNT_IDS
            or element.tag in _APP_TAGS
            or any(element.get(a) is not None for a in _MOUNT_ATTRIBUTES)
        )
        if is_mount and len(_SPACE.sub("", element.text_content())) <= _MOUNT_EMPTY_CHARS:
            return True
    return False
