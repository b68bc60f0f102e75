"""The settings of downloading pages: the fetcher's limits and politeness
(WEBCTX_FETCH__<NAME>) and script-rendered pages (WEBCTX_RENDER__<NAME>), groups of the one
Settings (`webctx.settings.Settings.fetch`, `.render`)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode


class _Group(BaseModel):
    """A nested group of settings; field docstrings are their descriptions."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class FetchSettings(_Group):
    """Limits of the page fetcher (WEBCTX_FETCH__<NAME>)."""

    connect_timeout_s: float = 5.0
    """TCP/TLS connect timeout."""
    read_timeout_s: float = 10.0
    """Timeout of one read."""
    total_timeout_s: float = 20.0
    """Hard deadline of one fetch, redirects and body included (a trickling server is cut off)."""
    max_bytes: int = 5_000_000
    """Cap on the decoded body; larger pages fail `too_large`."""
    max_redirects: int = 5
    """Redirect hops followed at most; each hop is re-checked by the guard."""
    per_host_concurrency: int = 2
    """Simultaneous requests to one host from one process."""
    concurrency: int = 32
    """Simultaneous downloads of one fetcher (its connection pool holds twice as many, for
    robots.txt and tdmrep.json alongside). A worker's fetcher takes at least the worker's
    threads (`WEBCTX_WORKER_CONCURRENCY`, or `webctx worker -c N`): below them a job's
    fetches queued for a free connection (docs/benchmarks.md, `latency`)."""
    extract_timeout_s: float = 15.0
    """Extraction of one page gives up after this long."""
    product_token: str = Field(default="webctx", pattern=r"^[A-Za-z_-]+$")
    """The one name robots.txt groups (`User-agent: webctx`), `X-Robots-Tag: webctx: …` and `<meta
    name="webctx">` are matched against, whole and case-insensitively (letters, `_`, `-`).
    Independent of the rest of the User-Agent: `Mozilla/5.0 (compatible; webctx/0.1)` is still
    matched as `webctx`."""
    user_agent: str = "webctx/0.1 (+https://github.com/webctx/webctx; research bot)"
    """Sent with every request to a site: pages, robots.txt, tdmrep.json, sitemaps and feeds,
    revalidations, and the browser's requests when rendering. It must contain the product token
    as a product name (`webctx/0.1`, `Mozilla/5.0 (compatible; webctx/0.1)`); one that does not
    (`MyBot/1.0`) is a configuration error at start, never silently patched: the sites would see
    one name and robots.txt would be matched for another."""
    allowed_ports: list[int] = Field(default_factory=lambda: [80, 443])
    """Ports fetchable on any public host (JSON list). Other ports only inside
    `WEBCTX_ALLOWED_NETWORKS`, or on non-public addresses with `WEBCTX_ALLOW_PRIVATE_NETWORKS`."""
    respect_robots: bool = True
    """Honour robots.txt by RFC 9309 (fetched through the guard, one request per origin at a time,
    cached per origin; docs/security.md)."""
    robots_ttl_s: float = 3600.0
    """How long a robots.txt (and an origin's `/.well-known/tdmrep.json`) stays cached (an
    unanswered one, and a robots.txt answering 5xx or 429: 300 s at most)."""
    opt_outs: Literal["honour", "report"] = "honour"
    """Publishers' opt-outs beyond robots.txt (`X-Robots-Tag` / `<meta name="robots">` `noai` or
    `none`, a TDM reservation by header, meta tag or `tdmrep.json`; docs/security.md). `honour`:
    such a page fails `opted_out` with the rule that refused it, and its text is neither stored,
    embedded nor bundled. `report`: for operators with a licence to mine the pages; they are used
    and their bundle sources carry `opt_out` (the rule), shown in the Markdown. `noindex` keeps a
    page out of the persistent index in both modes."""
    per_host_delay_s: float = 1.0
    """Minimum gap between request starts to one host, across all fetch workers in broker mode
    (paced in Redis; a larger robots.txt `Crawl-delay`, fractions too, up to 60 s, wins)."""
    max_backoff_s: float = 300.0
    """Longest pause of a host after a 429/503 (`Retry-After` honoured, else doubling from 1 s)."""
    pdf_max_bytes: int = 20_000_000
    """Cap on a PDF body (`application/pdf`, or an untyped body at a `.pdf` path that starts like a
    PDF); other bodies keep `max_bytes`."""
    pdf_max_pages: int = 300
    """A PDF with more pages is refused (`too_many_pages`) before any page is read."""
    pdf_cpu_s: float = 15.0
    """CPU seconds of the child process that reads one PDF (RLIMIT_CPU; `timeout`)."""
    pdf_memory_mb: int = 256
    """Address space of that child (RLIMIT_AS), in MiB; past it the PDF is `too_large`."""
    pdf_timeout_s: float = 20.0
    """Wall-clock deadline of that child; it is killed past it (`timeout`)."""

    @model_validator(mode="after")
    def _agent_names_token(self) -> FetchSettings:
        """A User-Agent that does not carry the product token would be matched under one
        name and seen by sites under another: refused, not patched."""
        if not agent_has_token(self.user_agent, self.product_token):
            raise ValueError(
                f"WEBCTX_FETCH__USER_AGENT {self.user_agent!r} does not contain the product "
                f"token {self.product_token!r} (WEBCTX_FETCH__PRODUCT_TOKEN) as a product "
                f"name, e.g. {self.product_token}/1.0: robots.txt rules for it would not "
                "apply to what sites see; put it in the User-Agent or set the token"
            )
        return self


def agent_has_token(user_agent: str, token: str) -> bool:
    """True if `token` stands in `user_agent` as a whole product name (`webctx/0.1`,
    `(compatible; webctx/0.1)`), compared case-insensitively."""
    pattern = rf"(?<![A-Za-z0-9_-]){re.escape(token)}(?![A-Za-z0-9_-])"
    return re.search(pattern, user_agent, re.IGNORECASE) is not None


class RenderSettings(_Group):
    """Pages rendered by script: headless Chromium behind the fetch guard
    (WEBCTX_RENDER__<NAME>, docs/security.md)."""

    enabled: bool = True
    """False: a page that needs a browser fails `needs_render` (no render queue)."""
    browser: str = ""
    """Chromium's executable; empty: the first of chromium, chromium-browser, google-chrome
    on PATH. Never downloaded."""
    remote: bool = False
    """Divert to the render queue even when this process has no browser (a render worker
    elsewhere has one): set on fetch workers of a deployment with a render role."""
    always_domains: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Rendered without trying the static fetch first (subdomains included)."""
    never_domains: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Never rendered: their shells fail `needs_render`."""
    page_timeout_s: float = Field(default=20.0, gt=0)
    """The whole render of one page: navigation, scripts, settling, reading the DOM."""
    settle_ms: int = Field(default=500, ge=0)
    """Quiet time after the load event, for scripts that fill the page late."""
    max_page_bytes: int = Field(default=20_000_000, ge=100_000)
    """Bytes of all responses one page may load; further requests are refused."""
    js_heap_mb: int = Field(default=256, ge=32)
    """V8 heap cap of each renderer process (--max-old-space-size)."""
    memory_mb: int = Field(default=1024, ge=128)
    """The browser's processes together (RSS) above this: restarted after the page."""
    concurrency: int = Field(default=2, ge=1)
    """Pages one browser renders at once (each in its own context)."""

    @field_validator("always_domains", "never_domains", mode="before")
    @classmethod
    def _split_domains(cls, value: object) -> object:
        """ "a.org, b.org" or a JSON list; lower-cased."""
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else text.split(",")
        if isinstance(value, list):
            return [str(part).strip().lower() for part in value if str(part).strip()]
        return value
