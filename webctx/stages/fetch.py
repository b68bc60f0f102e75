"""The fetch stage: download a URL under the fetch policy, then extract its main text.

trafilatura only ever sees the HTML string we fetched: it never downloads (its own fetcher
would bypass the address guard, and falls back to unverified TLS).
"""

from __future__ import annotations

import codecs
import hashlib
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import date
from typing import TypeVar
from urllib.parse import urlsplit

import trafilatura
from htmldate import find_date
from lxml.html import HtmlElement
from trafilatura.metadata import examine_meta, extract_meta_json, extract_title
from trafilatura.utils import load_html

from webctx.errors import ExtractionError, Interstitial, NeedsRender, UnsupportedContent
from webctx.models import Download, Page, PageLink
from webctx.protocols import Fetcher, PdfReader
from webctx.stages.format_chars import protect
from webctx.stages.language import declared_language, detect_language
from webctx.stages.links import same_site_links
from webctx.stages.pdf import extract_pdf
from webctx.stages.shell import script_shell
from webctx.stages.visibility import remove_hidden, strip_invisible

T = TypeVar("T")

MIN_TEXT_CHARS = 100
"""Below this, an extraction is treated as empty (menus, cookie banners, error stubs)."""
_INTERSTITIAL_MAX_CHARS = 2000  # longer texts are articles, even ones that mention CAPTCHAs
_BOM_CODECS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
               (codecs.BOM_UTF16_BE, "utf-16"))  # fmt: skip
# WHATWG Encoding: these labels mean windows-1252 on the web.
_LABEL_ALIASES = {"iso-8859-1": "cp1252", "latin-1": "cp1252", "ascii": "cp1252",
                  "us-ascii": "cp1252", "latin1": "cp1252"}  # fmt: skip
_META_CHARSET = re.compile(rb"<meta[^>]{0,200}?charset\s*=\s*[\"']?\s*([\w.:-]+)", re.I)
_HEADER_CHARSET = re.compile(r";\s*charset\s*=\s*[\"']?([\w.:-]+)", re.I)
_TITLE = re.compile(r"<title[^>]*>([^<]{0,300})", re.I)
_INTERSTITIAL = re.compile(
    r"enable javascript|javascript is (?:disabled|required)|enable cookies"
    r"|checking (?:your browser|if the site connection is secure)"
    r"|verify(?:ing)? (?:that )?you are (?:a )?human|are you a robot|captcha"
    r"|unusual traffic|access denied|request (?:unsuccessful|blocked)"
    r"|attention required|just a moment\.\.\.|ddos protection",
    re.I,
)
# Markup of challenge pages only: reCAPTCHA/hCaptcha widgets (g-recaptcha, h-captcha) also sit
# in comment and newsletter forms of ordinary articles (7 of 181 pages of the extraction
# benchmark were refused for them); a challenge built on them says so in its text.
# Matched as plain substrings of the lower-cased markup: a case-insensitive regex alternation
# over 200 kB took 1.3 ms a page on the extraction benchmark, 5 % of extracting it.
_CHALLENGE_MARKUP = ("cf-challenge", "challenge-platform", "cf_chl_", "px-captcha", "datadome")


@dataclass
class _Meta:
    title: str = ""
    site: str = ""
    author: str | None = None
    published: str | None = None
    language: str | None = None
    links: list[PageLink] = field(default_factory=list)


def fetch_page(
    url: str, fetcher: Fetcher, *, extract_timeout_s: float = 15.0, pdf: PdfReader | None = None
) -> Page:
    """Fetch `url` with `fetcher` and extract its main text. Raises FetchError subclasses."""
    return extract_page(fetcher.fetch(url), timeout_s=extract_timeout_s, pdf=pdf)


HtmlExtractor = Callable[[str, str, float], "tuple[str, _Meta] | None"]
"""(html, url, timeout_s) -> what `_extract_html` returns, extracted elsewhere (a child
process: webctx/adapters/extract_children.py), or None: extract it here."""


def extract_page(
    download: Download,
    *,
    timeout_s: float = 15.0,
    rendered: bool = False,
    pdf: PdfReader | None = None,
    html: HtmlExtractor | None = None,
) -> Page:
    """The main text and metadata of a download; raises ExtractionError (UnreadablePdf),
    BlockedURL, NeedsRender for a script-rendered shell (unless the download is already
    `rendered`), or UnsupportedContent for a PDF when there is no `pdf` reader. `html`
    extracts an HTML page elsewhere when it can."""
    media = download.content_type.split(";")[0].strip().lower()
    if media == "application/pdf":
        if pdf is None:
            raise UnsupportedContent(download.url, "content type 'application/pdf'")
        return extract_pdf(download, pdf)
    source = decode_body(download)
    host = urlsplit(download.final_url).hostname or ""
    if media == "text/plain":
        text, meta = strip_invisible(source.strip()), _Meta()
    else:
        found = html(source, download.final_url, timeout_s) if html is not None else None
        text, meta = found or _call_with_timeout(
            lambda: _extract_html(source, download.final_url), timeout_s, download.url
        )
    if len(text) < MIN_TEXT_CHARS and not rendered and media != "text/plain":
        # Before the interstitial check: a shell's <noscript> says "enable JavaScript" too.
        # A challenge page is scripts and a notice as well: its title and markup say so.
        shell = None if detect_challenge(meta.title, source) else script_shell(source)
        if shell is not None:
            raise NeedsRender(download.url, f"the page is rendered by script ({shell})")
    reason = detect_interstitial(meta.title, text, "" if media == "text/plain" else source)
    if reason is not None:
        raise Interstitial(download.url, f"interstitial page ({reason!r})")
    if len(text) < MIN_TEXT_CHARS:
        raise ExtractionError(download.url, f"only {len(text)} characters of main text")
    return Page(
        url=download.url,
        final_url=download.final_url,
        title=meta.title,
        site=meta.site or host,
        author=meta.author,
        language=meta.language or detect_language(text),
        published=meta.published,
        fetched_at=download.fetched_at,
        content_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        text=text,
        etag=download.etag,
        last_modified=download.last_modified,
        links=meta.links,
    )


def decode_body(download: Download) -> str:
    """The body as text: BOM, then declared charset, then <meta> charset, then UTF-8.

    Undecodable bytes become U+FFFD; a broken or bogus encoding never raises.
    """
    body = download.body
    for bom, bom_codec in _BOM_CODECS:
        if body.startswith(bom):
            return body.decode(bom_codec, errors="replace")
    match = _META_CHARSET.search(body[:4096])
    meta_label = match.group(1).decode("ascii", "replace") if match else None
    for label in (download.encoding, _header_charset(download.content_type), meta_label):
        codec = _codec(label)
        if codec is not None:
            return body.decode(codec, errors="replace")
    return body.decode("utf-8", errors="replace")


def _header_charset(content_type: str) -> str | None:
    # Fakes and callers may put the whole Content-Type header in `content_type`.
    match = _HEADER_CHARSET.search(content_type)
    return match.group(1) if match else None


def _codec(label: str | None) -> str | None:
    if not label:
        return None
    key = label.strip().lower()
    try:
        name = codecs.lookup(_LABEL_ALIASES.get(key, key)).name
    except LookupError:
        return None
    # A UTF-16 label on bytes we could read as ASCII is a lie (WHATWG: use UTF-8).
    return "utf-8" if name.startswith("utf-16") else name


def detect_interstitial(title: str, text: str, html: str) -> str | None:
    """The tell-tale phrase if this looks like a block/CAPTCHA/"enable JavaScript" page."""
    if len(text) > _INTERSTITIAL_MAX_CHARS:
        return None
    match = _INTERSTITIAL.search(text)
    return match.group(0).lower() if match else detect_challenge(title, html)


def detect_challenge(title: str, html: str) -> str | None:
    """The tell-tale of a bot challenge in a page's title or markup (not its text)."""
    match = _INTERSTITIAL.search(title)
    if match:
        return match.group(0).lower()
    markup = html[:200_000].lower()
    return next((marker for marker in _CHALLENGE_MARKUP if marker in markup), None)


def _extract_html(html: str, url: str) -> tuple[str, _Meta]:
    # Plain text for chunking; precision over recall because boilerplate in a context
    # bundle costs tokens and misleads citations; comments are not the source's claims;
    # tables stay, as they often carry the facts a research question is after.
    # (bench/extraction.py: F1 0.964 vs 0.953 for trafilatura's defaults.)
    kept = protect(html)  # format characters survive extraction (webctx.stages.format_chars)
    html = kept.html
    try:
        tree = load_html(html)  # parsed once: metadata reads it first, extraction then cleans it
        meta = _metadata(tree, html, url)
        links: list[PageLink] = []
        if tree is not None:
            remove_hidden(tree)  # text a reader does not see is not the page's (visibility.py)
            links = same_site_links(tree, url)  # before trafilatura cleans the tree
        doc = trafilatura.bare_extraction(
            tree if tree is not None else html,
            url=url,
            with_metadata=False,
            favor_precision=True,
            include_comments=False,
            include_tables=True,
            include_links=False,
            include_images=False,
        )
    except Exception as exc:  # lxml and trafilatura raise assorted errors on odd markup
        raise ExtractionError(url, f"extractor failed: {type(exc).__name__}: {exc}") from exc
    meta = _Meta(title=_clean(kept.restore(meta.title)), site=_clean(kept.restore(meta.site)),
                 author=_clean(kept.restore(meta.author)) if meta.author else None,
                 published=meta.published, language=meta.language, links=links)  # fmt: skip
    if doc is None or isinstance(doc, dict):
        return "", meta
    # Invisible word splitters go before hashing and chunking: offsets index this text.
    return strip_invisible(kept.restore((doc.text or "").strip())), meta


def _clean(value: str) -> str:
    """A metadata field without invisible characters, on one line."""
    return " ".join(strip_invisible(value).split())


def _metadata(tree: HtmlElement | None, html: str, url: str) -> _Meta:
    """Title, site, author and date from meta tags and JSON-LD, the date by htmldate.

    trafilatura's `with_metadata` also guesses authors from bylines and collects
    categories, tags and licence: a third of the extraction time (bench/extraction.py),
    for fields a bundle does not show.
    """
    if tree is None:
        title = _TITLE.search(html[:65536])
        return _Meta(title=title.group(1).strip() if title else "")
    found = examine_meta(tree)
    if found.author and " " not in found.author:
        found.author = None  # a single word is a handle or a section, as trafilatura does
    if not (found.title and found.author and found.sitename):  # JSON-LD is the slow part
        try:
            found = extract_meta_json(tree, found)
        except Exception:  # noqa: BLE001 - trafilatura's JSON-LD parser has bugs; keep tags
            pass
    published = find_date(
        tree, url=url, original_date=True, extensive_search=False, max_date=date.today().isoformat()
    )
    return _Meta(
        title=(found.title or extract_title(tree) or "").strip(),
        site=(found.sitename or "").strip().lstrip("@"),
        author=found.author or None,
        published=_iso_date(published),
        language=declared_language(tree),
    )


def _iso_date(value: str | None) -> str | None:
    try:
        return date.fromisoformat(value[:10]).isoformat() if value else None
    except ValueError:
        return None


def _call_with_timeout(func: Callable[[], T], timeout_s: float, url: str) -> T:
    """`func()` in a daemon thread; ExtractionError if it has not returned after `timeout_s`.

    Python cannot kill a thread: on timeout the extraction keeps running (and using CPU)
    until it finishes on its own. The input is capped by FetchSettings.max_bytes, which
    bounds that work, and the Celery task's hard time limit is the last backstop.
    """
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(func())
        except BaseException as exc:  # handed to the caller below
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True, name="webctx-extract").start()
    try:
        return future.result(timeout=timeout_s)
    except TimeoutError as exc:
        raise ExtractionError(url, f"extraction took over {timeout_s}s") from exc
