"""Same-site links of an extracted page: where a `depth=deep` job may look next.

Read from the parsed tree after hidden elements are removed (a link a reader cannot see is
not the page's), before trafilatura cleans the tree. Only http(s) links to the page's own
host (a leading `www.` aside) are kept; each is fetched, if ever, through the fetch guard
like any other URL.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit, urlunsplit

from lxml.html import HtmlElement

from webctx.models import PageLink
from webctx.stages.visibility import strip_invisible

MAX_LINKS = 100
"""Links kept per page at most (in page order)."""
MAX_ANCHOR_CHARS = 120


def site_host(url: str) -> str:
    """The host a link must share with its page: lower case, without a leading `www.`."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return ""
    return host.removeprefix("www.")


def same_site_links(tree: HtmlElement, url: str, *, limit: int = MAX_LINKS) -> list[PageLink]:
    """The page's visible http(s) links to its own host, absolute, without fragments, each
    once, with their anchor text; not the page itself."""
    host = site_host(url)
    own = _without_fragment(url)
    seen: set[str] = set()
    links: list[PageLink] = []
    for anchor in tree.iter("a"):
        href = (anchor.get("href") or "").strip()
        if not href or href.startswith("#"):
            continue
        try:
            target = _without_fragment(urljoin(url, href))
        except ValueError:  # a malformed href (an unclosed IPv6 bracket...)
            continue
        if urlsplit(target).scheme not in ("http", "https") or site_host(target) != host:
            continue
        if target == own or target in seen:
            continue
        seen.add(target)
        text = " ".join(strip_invisible(anchor.text_content()).split())[:MAX_ANCHOR_CHARS]
        links.append(PageLink(url=target, text=text))
        if len(links) >= limit:
            break
    return links


def _without_fragment(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))
