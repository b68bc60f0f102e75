"""A loopback site whose publisher opts out in every way webctx reads, beside allowed
controls: one page per form, each with its own marker word (`OPTOUT<n>` on refused
pages, `ALLOWED<n>` on the others) so a test can tell which text reached a bundle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from webctx.devweb.site import SitePage

USER_AGENT = "Mozilla/5.0 (compatible; webctx/0.1; +https://example.invalid/bot)"
"""A custom User-Agent whose first word is not the product token."""
QUESTION = "Quillon valve pressure at the Brannock plant"
ROBOTS = "User-agent: mozilla\nDisallow: /\n\nUser-agent: webctx\nDisallow: /robots-blocked\n"
TDMREP = [
    {"location": "/private/*", "tdm-reservation": 1},
    {"location": "/*", "tdm-reservation": 0},
]


@dataclass
class Form:
    """One page: how it opts out (headers, head markup) and the rule a refusal names."""

    headers: dict[str, str] = field(default_factory=dict)
    head: str = ""
    rule: str | None = None  # None: allowed
    noindex: bool = False


FORMS: dict[str, Form] = {
    "/xrt-noai": Form({"X-Robots-Tag": "noai"}, rule="X-Robots-Tag: noai"),
    "/xrt-scoped-none": Form({"X-Robots-Tag": "webctx: none"}, rule="X-Robots-Tag: webctx: none"),
    "/meta-robots-noai": Form(head='<meta name="robots" content="noai, noimageai">',
                              rule='meta name="robots": noai'),
    "/meta-token-none": Form(head='<meta name="WEBCTX" content="none">',
                             rule='meta name="webctx": none'),
    "/tdm-header": Form({"tdm-reservation": "1"}, rule="tdm-reservation: 1"),
    "/tdm-meta": Form(head='<meta name="tdm-reservation" content="1">',
                      rule='meta name="tdm-reservation": 1'),
    "/private/tdm-file": Form(rule="tdmrep.json: /private/* tdm-reservation=1"),
    "/allowed": Form(),
    "/xrt-other-bot": Form({"X-Robots-Tag": "otherbot: noai"}),
    "/meta-noimageai": Form(head='<meta name="robots" content="noimageai, nofollow">'),
    "/noindex": Form({"X-Robots-Tag": "noindex"}, noindex=True),
}  # fmt: skip
ROBOTS_BLOCKED = "/robots-blocked"


def marker(path: str) -> str:
    """The word only `path`'s page holds."""
    if path not in FORMS:
        return "ROBOTSBLOCKED"
    return f"{'OPTOUT' if FORMS[path].rule else 'ALLOWED'}{list(FORMS).index(path) + 1}"


def article(path: str, version: int = 1) -> str:
    """A page of its own facts (no two alike, so none is dropped as a near-duplicate)."""
    n, word = list(FORMS).index(path) + 1 if path in FORMS else 99, marker(path)
    head = FORMS[path].head if path in FORMS else ""
    sentences = " ".join(
        f"Inspection {i} of unit {n} found the Quillon valve at the Brannock plant opening at "
        f"{n * 10 + i} bar, reading {word}, after {i + n} weeks of service in version {version}."
        for i in range(4)
    )
    return (
        f"<!doctype html><html lang=en><head><title>Quillon valve unit {n}</title>{head}</head>"
        f"<body><article><h1>Quillon valve unit {n}</h1><p>{sentences}</p>"
        f"<p>The plant engineers logged {word} with the pressure of unit {n}.</p>"
        "</article></body></html>"
    )


def optout_pages() -> dict[str, SitePage]:
    """The site: every form's page, a page robots.txt refuses, robots.txt, tdmrep.json."""
    pages = {path: SitePage(article(path), headers=dict(form.headers))
             for path, form in FORMS.items()}  # fmt: skip
    pages[ROBOTS_BLOCKED] = SitePage(article(ROBOTS_BLOCKED))
    pages["/robots.txt"] = SitePage(ROBOTS, content_type="text/plain")
    pages["/.well-known/tdmrep.json"] = SitePage(json.dumps(TDMREP),
                                                 content_type="application/json")  # fmt: skip
    return pages
