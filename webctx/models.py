"""Pydantic records passed between stages and stored between tasks."""

from __future__ import annotations

import ipaddress
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import idna
from pydantic import AfterValidator, BaseModel, Field, field_validator

from webctx.knobs import KNOBS, help_text

BUNDLE_SCHEMA_VERSION = 1

Depth = Literal["fast", "deep"]
"""A job's depth (webctx/knobs.py `DEPTHS`): one round, or further rounds for weak facets."""
Retrieved = Literal["live", "revalidated", "cached", "index", "provider"]
"""Where a source's text came from: a download for this job, a stored copy the server
confirmed unchanged (304), the shared page cache, the persistent index, or the search
provider's copy of the page (its download failed: timeout, 5xx, blocked)."""


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


# What a terminal or a search engine would act on in a question, instead of showing it:
# ECMA-48 escape and control sequences whole (CSI, OSC/DCS/SOS/PM/APC up to their
# terminator, two-character escapes like ESC c, the full reset), in their 7-bit and C1 forms.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]"
)
# Then every other C0 and C1 control but whitespace (NUL, BEL, ESC, DEL...), and the
# invisible characters that reorder or hide text: bidi embeddings, overrides, isolates and
# marks, zero-width space, word joiner, BOM, and the tag characters (U+E0000-E007F).
# Zero-width (non-)joiners stay: some scripts' spelling needs them.
_CONTROLS = re.compile(
    "[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\u061c\u200b\u200e\u200f\u202a-\u202e"
    "\u2060\u2066-\u2069\ufeff\U000e0000-\U000e007f]"
)


def clean_text(value: str) -> str:
    """`value` without terminal control sequences, control and invisible characters, its
    whitespace collapsed to single spaces (what a question may hold: echoed to terminals,
    sent to search engines)."""
    return " ".join(_CONTROLS.sub("", _ESCAPES.sub("", value)).split())


_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:(?!\d*\Z)", re.I)
_NOT_IN_HOSTS = (("/", "a path"), ("@", "userinfo"), ("?", "a query"), ("#", "a fragment"),
                 ("\\", "a backslash"), (":", "a port"))  # fmt: skip


def host_name(value: str) -> str:
    """`value` as a domain filter: a lower-case ASCII host name (IDNA: `bücher.de` ->
    `xn--bcher-kva.de`), a leading `*.` and a trailing dot dropped (a filter covers
    subdomains anyway); ValueError naming the value when it is not a host name (a URL, a
    port, a path, userinfo, an IP address, spaces, control or invisible characters)."""
    text = value.strip()
    shown = repr(value if len(value) <= 80 else value[:80] + "…")
    if not text:
        raise ValueError(f"{shown} is empty: give a host name (example.com)")
    if any(not c.isprintable() or c.isspace() for c in text):
        raise ValueError(f"{shown} is not a host name: it holds spaces, control or "
                         "invisible characters")  # fmt: skip
    if _SCHEME.match(text):
        raise ValueError(f"{shown} is not a host name: it has a scheme ({_hint(text)})")
    if _is_ip(text):
        raise ValueError(f"{shown} is an IP address: domains are host names (example.com)")
    for mark, what in _NOT_IN_HOSTS:
        if mark in text:
            raise ValueError(f"{shown} is not a host name: it has {what} ({_hint(text)})")
    name = text.removeprefix("*.").rstrip(".")
    try:
        ascii_name = idna.encode(name, uts46=True, std3_rules=True).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise ValueError(f"{shown} is not a valid host name ({exc})") from exc
    if ascii_name.rsplit(".", 1)[-1].isdigit():
        raise ValueError(f"{shown} is not a host name: it ends in a number (an IP address?)")
    return ascii_name


def _hint(text: str) -> str:
    """How to write what `text` names as a host name (its URL's host, when it has one)."""
    try:
        host = urlsplit(text if "://" in text else "//" + text).hostname
        if _SCHEME.match(text) and "://" not in text:  # javascript:…, mailto:…
            host = None
    except ValueError:
        host = None
    return f"give its host name alone: {host}" if host else "give a host name: example.com"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def ascii_host(host: str) -> str:
    """A URL's host in the form `host_name` gives filters (lower case, IDNA), when it has
    one; else lower-cased as it is."""
    try:
        return host_name(host)
    except ValueError:
        return host.lower().rstrip(".")


Domain = Annotated[str, AfterValidator(host_name)]
"""A domain filter entry: a host name, normalised by `host_name`."""


def _knob(name: str) -> Any:
    """A JobRequest field from the knobs' table (webctx/knobs.py)."""
    knob = KNOBS[name]
    return Field(default=knob.default, ge=knob.low, le=knob.high, description=help_text(name))


class JobRequest(BaseModel):
    """What a caller asks for: the question and the knobs of one research job (their
    defaults, ranges and help: webctx/knobs.py, the table every surface reads)."""

    question: str = Field(min_length=1, max_length=2000, description="The question to research.")
    max_sources: int = _knob("max_sources")
    top_k: int = _knob("top_k")
    token_budget: int = _knob("token_budget")
    max_queries: int = _knob("max_queries")
    include_domains: list[Domain] = Field(
        default_factory=list,
        description="Only sources on these host names or their subdomains (`example.com`, "
        "`bücher.de`; a leading `*.` is allowed); not URLs, ports or IP addresses.",
    )
    exclude_domains: list[Domain] = Field(
        default_factory=list,
        description="No sources on these host names or their subdomains (as include_domains).",
    )
    recency_days: int | None = _knob("recency_days")
    max_age: int | None = _knob("max_age")
    stale_if_error: bool = _knob("stale_if_error")
    depth: Depth = _knob("depth")

    @field_validator("question")
    @classmethod
    def _question_has_text(cls, value: str) -> str:
        value = clean_text(value)
        if not value:
            raise ValueError("question must contain text")
        return value


class JobStatus(StrEnum):
    """Lifecycle of a job."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class SearchResult(BaseModel):
    """One hit from a search provider."""

    url: str
    title: str = ""
    snippet: str = ""
    rank: int = Field(ge=0, description="0-based position in the provider's answer")
    query: str = ""
    provider: str = ""
    content: str | None = None
    """The page's text as the provider returned it (Tavily, Exa), if it did: it stands in for
    the page when its download fails for a transport reason."""


class Download(BaseModel):
    """A fetched HTTP body, before extraction."""

    url: str
    final_url: str
    status: int
    content_type: str
    body: bytes
    encoding: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    fetched_at: datetime = Field(default_factory=utcnow)
    headers: list[tuple[str, str]] = Field(default_factory=list)
    """The response headers publishers opt out with (X-Robots-Tag, tdm-reservation,
    tdm-policy), lower-cased names, in order; the others are not kept."""
    tdmrep_rule: str | None = None
    """The rule of the origin's /.well-known/tdmrep.json that reserves this URL, if any."""


class PageLink(BaseModel):
    """A same-site link a page shows: where it points and its anchor text."""

    url: str
    text: str = ""


class Page(BaseModel):
    """The extracted main text of one source, plus its metadata."""

    url: str
    final_url: str
    title: str = ""
    site: str = ""
    author: str | None = None
    language: str | None = None
    """BCP 47 tag the page declares, else the ISO 639-1 code of its detected language."""
    published: str | None = None
    fetched_at: datetime
    content_sha256: str
    text: str
    page_starts: list[int] | None = None
    """A PDF's pages: where page i + 1 starts in `text`; None for web pages."""
    etag: str | None = None
    last_modified: str | None = None
    opt_out: str | None = None
    """The publisher's rule reserving the page (`X-Robots-Tag: noai`), kept only when
    opt-outs are reported, not honoured (WEBCTX_FETCH__OPT_OUTS=report)."""
    noindex: str | None = None
    """The rule keeping the page out of the persistent index (`X-Robots-Tag: noindex`)."""
    links: list[PageLink] = Field(default_factory=list)
    """Same-site links the page shows (visible ones, in page order, capped): where a
    `depth=deep` job's further round may look next."""


class Retrieval(BaseModel):
    """How one job got a page: where from, when its text was last confirmed current."""

    retrieved: Retrieved
    checked_at: datetime
    stale: bool = False
    """True when the download failed and an older copy was used (`stale_if_error`)."""
    stale_reason: str | None = None
    """Why the download failed, when `stale`."""


class PdfText(BaseModel):
    """What a PDF reader gives back: each page's raw text and the document's metadata."""

    pages: list[str]
    title: str | None = None
    author: str | None = None
    created: str | None = None
    """The PDF date string of /CreationDate (`D:20240131…`), if any."""


class Chunk(BaseModel):
    """A token-bounded span of a page's text; `text == page.text[start:end]`."""

    content_sha256: str
    index: int
    start: int
    end: int
    text: str
    tokens: int


class StoredChunk(BaseModel):
    """A chunk as held in the vector store: id, vector and payload."""

    id: str
    vector: list[float]
    chunk: Chunk
    url: str
    model: str


class ScoredChunk(BaseModel):
    """A chunk retrieved for a question, with its cosine similarity."""

    chunk: Chunk
    url: str
    score: float
    vector: list[float] = Field(default_factory=list, repr=False)
    dense: float | None = None
    """Its cosine to the question before any fusion, when known (coverage reads it)."""


class Failure(BaseModel):
    """A source that did not make it, and why."""

    url: str
    stage: Literal["search", "fetch", "extract", "render", "embed", "store", "rank"]
    error: str
    reason: str = "error"


class BundleSource(BaseModel):
    """A cited source; `id` is the citation number."""

    id: int
    url: str
    final_url: str
    title: str
    site: str
    published: str | None
    """ISO 8601 date (YYYY-MM-DD)."""
    fetched_at: datetime
    content_sha256: str
    author: str | None = None
    language: str | None = None
    """BCP 47 tag the page declares (`en-GB`), else the detected ISO 639-1 code, else None."""
    retrieved: Retrieved | None = None
    """live, revalidated (304), cached (the shared page cache), index, or provider (the search
    provider's text: the download failed); None in bundles made before it was recorded."""
    checked_at: datetime | None = None
    """When the text was last confirmed current (downloaded or revalidated)."""
    stale: bool = False
    """The download failed and this older copy was used (the request's `stale_if_error`)."""
    stale_reason: str | None = None
    """Why the download failed, when `stale`."""
    flags: list[str] = Field(default_factory=list)
    """`["instructions"]` when the title, site or author addresses the model reading it."""
    opt_out: str | None = None
    """The publisher reserved this page (`X-Robots-Tag: noai`, a TDM reservation) and the
    operator reports opt-outs instead of honouring them (WEBCTX_FETCH__OPT_OUTS=report)."""


class BundleChunk(BaseModel):
    """A chunk placed in the bundle; `source` is the citation number."""

    source: int
    text: str
    start: int
    end: int
    tokens: int
    score: float
    flags: list[str] = Field(default_factory=list)
    """`["instructions"]` when the passage addresses the model reading it (kept, not obeyed)."""
    pages: list[int] | None = None
    """Of a PDF source: the first and last page (1-based) the chunk comes from."""


class RoundStats(BaseModel):
    """One round of a `depth=deep` job: what it sent and found, and what it left."""

    round: int
    queries: int = 0
    """Search queries it sent."""
    pages: int = 0
    """New pages it chose to fetch (search results and same-site links)."""
    links: int = 0
    """Of those, same-site links of the best pages."""
    new_chunks: int = 0
    """Chunks its pages added."""
    seconds: float = 0.0
    facets: list[str] = Field(default_factory=list)
    """The facets it looked for (round 1: the whole question)."""
    missing: list[str] = Field(default_factory=list)
    """Facets still weak or missing after it."""
    stopped: str = ""
    """The last round: why no further round followed (`sufficient`, `max_rounds`...)."""


class BundleStats(BaseModel):
    """Counts and timings of one job."""

    queries: int = 0
    results: int = 0
    fetched: int = 0
    failed: int = 0
    chunks: int = 0
    embed_requests: int = 0
    tokens_embedded: int = 0
    cache_hits: int = 0
    tokens_saved: int = 0
    index_reused: int = 0
    """Sources taken from the persistent index (fresh) instead of fetched."""
    embedded_ahead: int = 0
    """Chunks of a first-pass job embedded as their pages arrived, before rank; those rank
    selects count among its `cache_hits`."""
    embedded_at_rank: int = 0
    """Texts a first-pass job's rank embedded itself (its selection's cache misses)."""
    bundle_tokens: int = 0
    flagged_chunks: int = 0
    """Chunks of the bundle flagged `instructions` (page text that addresses the model)."""
    query_providers: list[str] = Field(default_factory=list)
    """The search provider that answered each query, in `queries` order ("" when none did)."""
    search_requests: dict[str, int] = Field(default_factory=dict)
    """Search requests sent to each provider (answered or failed; one a breaker skipped is none)."""
    from_provider: int = 0
    """Sources whose text is the search provider's copy (`retrieved: "provider"`)."""
    coverage_judge: str = ""
    """The coverage judge's outcome: "" (off), `applied`, or `skipped: <why>` (the numbers
    stand)."""
    elapsed_s: float = 0.0
    stage_s: dict[str, float] = Field(default_factory=dict)
    rounds: list[RoundStats] = Field(default_factory=list)
    """The rounds of a `depth=deep` job, in order; empty for `fast`."""


class FacetCoverage(BaseModel):
    """How well the bundle covers one part of the question."""

    text: str
    status: Literal["supported", "weak", "missing"]
    """supported: a passage very likely answers it; weak: maybe; missing: no source found."""
    confidence: float = Field(ge=0.0, le=1.0)
    """Estimated probability that the bundle holds this part's answer."""
    chunks: list[int] = Field(default_factory=list)
    """Indices into the bundle's `chunks` of the passages found for this part."""


class Coverage(BaseModel):
    """Whether the bundle answers every part of the question, and how surely."""

    sufficient: bool
    """False when any facet is missing."""
    confidence: float = Field(ge=0.0, le=1.0)
    """Estimated probability that the bundle answers every facet."""
    facets: list[FacetCoverage]
    notes: list[str] = Field(default_factory=list)
    """Plain words for what is missing: `No source found for: <facet>`, one per facet."""


class Bundle(BaseModel):
    """The versioned, cited context bundle a job produces."""

    schema_version: int = BUNDLE_SCHEMA_VERSION
    job_id: str
    question: str
    queries: list[str]
    created_at: datetime = Field(default_factory=utcnow)
    sources: list[BundleSource]
    chunks: list[BundleChunk]
    failures: list[Failure] = Field(default_factory=list)
    stats: BundleStats = Field(default_factory=BundleStats)
    coverage: Coverage | None = None
    """Per-facet coverage and its confidence; None in bundles made before it existed."""
