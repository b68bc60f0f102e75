"""The PDF half of the fetch stage: a PDF's page texts (read by a `PdfReader`, in a sandbox)
assembled into one text with page start offsets, and a chunk's pages from its offsets.

Citations stay exact: chunks are cut from the assembled text, so `text ==
page.text[start:end]` holds as for HTML; `page_starts[i]` is where page i + 1 begins.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections.abc import Sequence
from datetime import date
from urllib.parse import unquote, urlsplit

from webctx.errors import ExtractionError, UnreadablePdf
from webctx.models import Download, Page, PdfText
from webctx.protocols import PdfReader
from webctx.stages.language import detect_language

MIN_PDF_CHARS = 100
"""Below this many characters of text, a PDF is refused like a page with no main text."""
_PAGE_SEPARATOR = "\n\n"
_SPACES = re.compile(r"[ \t\u00a0]+")
_BLANK_RUNS = re.compile(r"\n{3,}")
# A word broken at a line end: PDFium marks the hyphens it knows are soft with U+0002.
_BROKEN_WORD = re.compile(r"(\w)[\u0002\u00ad-]\n(?=[a-z])")
_CONTROLS = re.compile(r"[\u0000-\u0008\u000b\u000c\u000e-\u001f\ufffe\uffff]")
_PDF_DATE = re.compile(r"^(?:D:)?(\d{4})(\d{2})?(\d{2})?")


def assemble_text(pages: Sequence[str]) -> tuple[str, list[int]]:
    """One text from page texts, pages apart by a blank line; and where each page starts."""
    parts: list[str] = []
    starts: list[int] = []
    offset = 0
    for raw in pages:
        text = clean_page_text(raw)
        if parts and text:
            parts.append(_PAGE_SEPARATOR)
            offset += len(_PAGE_SEPARATOR)
        starts.append(offset)
        parts.append(text)
        offset += len(text)
    return "".join(parts), starts


def clean_page_text(raw: str) -> str:
    """A page's text: CRLF lines, runs of spaces, words broken at line ends and control
    characters tidied; paragraph breaks (blank lines) kept, at most one in a row."""
    text = raw.replace("\r\n", "\n").replace("\r", "\n")
    text = _BROKEN_WORD.sub(r"\1", text)
    text = _CONTROLS.sub("", text)
    lines = (_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()


def pages_of(page_starts: Sequence[int], start: int, end: int) -> list[int]:
    """The first and last page (1-based) of the span `start:end` of the assembled text."""
    first = max(1, bisect_right(page_starts, start))
    last = max(first, bisect_right(page_starts, max(start, end - 1)))
    return [first, last]


def extract_pdf(download: Download, reader: PdfReader) -> Page:
    """The Page of a PDF download: its text with page offsets, and metadata when present."""
    doc = reader.read(download.body, url=download.url)
    return pdf_page(download, doc)


def pdf_page(download: Download, doc: PdfText) -> Page:
    """The Page of a PDF's read text; UnreadablePdf `no_text_layer` when it has none."""
    text, starts = assemble_text(doc.pages)
    if not text.strip():
        message = f"no text on any of {len(doc.pages)} pages (a scan?)"
        raise UnreadablePdf(download.url, message, reason="no_text_layer")
    if len(text) < MIN_PDF_CHARS:
        raise ExtractionError(download.url, f"only {len(text)} characters of text")
    host = urlsplit(download.final_url).hostname or ""
    return Page(
        url=download.url,
        final_url=download.final_url,
        title=_one_line(doc.title or "") or _file_name(download.final_url) or host,
        site=host,
        author=_one_line(doc.author or "") or None,
        language=detect_language(text),
        published=pdf_date(doc.created),
        fetched_at=download.fetched_at,
        content_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        text=text,
        page_starts=starts,
        etag=download.etag,
        last_modified=download.last_modified,
    )


def pdf_date(value: str | None) -> str | None:
    """An ISO date from a PDF date string (`D:20240131120000+01'00'`), if it holds one."""
    match = _PDF_DATE.match(value.strip()) if value else None
    if match is None:
        return None
    year, month, day = match.group(1), match.group(2) or "01", match.group(3) or "01"
    try:
        return date(int(year), int(month), int(day)).isoformat()
    except ValueError:
        return None


def _file_name(url: str) -> str:
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1])


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
