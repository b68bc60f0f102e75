"""What the fetcher makes of a response: capped inflation, content-type parsing, sniffing,
the checks a 2xx head must pass and the Download a response becomes."""

from __future__ import annotations

import codecs
import re
import zlib
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx

from webctx.errors import ContentTooLarge, UnsupportedContent
from webctx.models import Download
from webctx.net.optouts import KEPT_HEADERS

# fmt: off
_BINARY_MAGIC = (b"%PDF-", b"\x89PNG", b"GIF87a", b"GIF89a", b"\xff\xd8\xff", b"PK\x03\x04",
                 b"\x1f\x8b", b"OggS", b"\x7fELF", b"wOFF", b"wOF2", b"%!PS")
# fmt: on
PDF = "application/pdf"
# Types a server may give a PDF it does not know (or no type): read as a PDF at a .pdf path.
_UNTYPED = frozenset({"", "application/octet-stream", "binary/octet-stream", "application/x-pdf"})
_CHARSET = re.compile(r"charset\s*=\s*[\"']?([\w.:-]+)", re.I)
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
_CONTROL_BYTES = bytes(b for b in range(32) if b not in b"\t\n\r\f\x1b") + b"\x7f"


class BodyDecoder:
    """Undoes Content-Encoding chunk by chunk, never producing more than `limit` bytes."""

    def __init__(
        self, url: str, content_encoding: str, limit: int, *, truncate: bool = False
    ) -> None:
        """Past `limit` decoded bytes: ContentTooLarge, or with `truncate` the first
        `limit` bytes are kept and `truncated` is set."""
        codings = [c.strip().lower() for c in content_encoding.split(",")]
        codings = [c for c in codings if c not in ("", "identity")]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise UnsupportedContent(url, f"content encoding {content_encoding!r}")
        # wbits | 32 accepts gzip and zlib headers; raw deflate is rare and refused.
        self._inflater = zlib.decompressobj(zlib.MAX_WBITS | 32) if codings else None
        self._url = url
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._truncate = truncate
        self.truncated = False

    def feed(self, data: bytes) -> None:
        """Decode and keep one raw chunk."""
        if self._inflater is not None:
            try:  # max_length: stop inflating one byte past the cap
                data = self._inflater.decompress(data, self._limit - self._size + 1)
            except zlib.error as exc:
                raise UnsupportedContent(self._url, f"corrupt compressed body: {exc}") from exc
        self._keep(data)

    def finish(self) -> bytes:
        """The whole decoded body."""
        if self._inflater is not None:
            self._keep(self._inflater.flush())
        return b"".join(self._parts)

    def _keep(self, data: bytes) -> None:
        if self._size + len(data) > self._limit:
            if not self._truncate:
                raise ContentTooLarge(self._url, f"decoded body over {self._limit} bytes")
            data, self.truncated = data[: self._limit - self._size], True
        self._size += len(data)
        self._parts.append(data)


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The Content-Length a response declares, if it is a plain number."""
    declared = headers.get("content-length", "")
    return int(declared) if declared.isdigit() else None


def parse_content_type(value: str) -> tuple[str, str | None]:
    """Media type (lower case) and a charset Python can decode, if declared."""
    media, _, params = value.partition(";")
    match = _CHARSET.search(params)
    try:
        charset = codecs.lookup(match.group(1)).name if match else None
    except LookupError:
        charset = None  # a bogus label: let the extractor sniff the body instead
    return media.strip().lower(), charset


def looks_binary(sample: bytes) -> bool:
    """True if the first bytes look like a binary format rather than text."""
    if sample.startswith(_BOMS):
        return False  # UTF-16 text is full of NULs
    if sample.lstrip().startswith(_BINARY_MAGIC) or b"\x00" in sample:
        return True
    controls = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    return controls > len(sample) // 20


def sniff_text_type(body: bytes) -> str:
    """text/html if the body starts like an HTML document, else text/plain."""
    head = body[:1024].lower()
    markers = (b"<!doctype html", b"<html", b"<head", b"<body")
    return "text/html" if any(m in head for m in markers) else "text/plain"


def conditional_headers(etag: str | None, last_modified: str | None) -> dict[str, str]:
    """The request headers of a revalidation."""
    headers: dict[str, str] = {}
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = last_modified
    return headers


def checked_head(
    final_url: str,
    headers: Mapping[str, str],
    types: frozenset[str],
    max_bytes: int,
    *,
    pdf_max_bytes: int = 0,
) -> tuple[str, str | None, int]:
    """The media type, charset and body cap of a 2xx response, if its type and size may
    be read. A PDF (when `types` has it) may be `pdf_max_bytes` long, so may an untyped or
    octet-stream body at a .pdf path (the body must then start like a PDF)."""
    media, charset = parse_content_type(headers.get("content-type", ""))
    limit = max_bytes
    if PDF in types and (media == PDF or (media in _UNTYPED and _pdf_path(final_url))):
        media, limit = PDF, max(max_bytes, pdf_max_bytes)
    if media and media not in types:
        raise UnsupportedContent(final_url, f"content type {media!r}")
    declared = declared_length(headers)
    if declared is not None and declared > limit:
        # Compressed or not, a body this long on the wire decodes to more than the cap.
        raise ContentTooLarge(final_url, f"Content-Length {declared} > {limit}")
    return media, charset, limit


def _pdf_path(url: str) -> bool:
    return urlsplit(url).path.lower().endswith(".pdf")


def kept_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The opt-out headers of an answer (`KEPT_HEADERS`), every value of each, in order."""
    items = headers.multi_items() if isinstance(headers, httpx.Headers) else headers.items()
    # The lean path joins a repeated header's values by newlines (revalidate.Answer).
    return [(k.lower(), v) for k, vs in items if k.lower() in KEPT_HEADERS for v in vs.split("\n")]


def not_modified(url: str, final_url: str, headers: Mapping[str, str]) -> Download:
    """The Download of a 304: no body, the validators the server sent."""
    return Download(
        url=url,
        final_url=final_url,
        status=304,
        content_type="",
        body=b"",
        etag=headers.get("etag"),
        last_modified=headers.get("last-modified"),
        headers=kept_headers(headers),
    )


def body_download(
    url: str,
    final_url: str,
    status: int,
    headers: Mapping[str, str],
    media: str,
    charset: str | None,
    body: bytes,
) -> Download:
    """The Download of a 2xx body, decoded and within the cap; binary bodies are refused,
    but for a PDF (which must start like one)."""
    if media == PDF:
        if b"%PDF-" not in body[:1024]:
            raise UnsupportedContent(final_url, "served as a PDF, but is none")
    elif looks_binary(body[:1024]):
        raise UnsupportedContent(final_url, f"binary body served as {media or 'untyped'}")
    return Download(
        url=url,
        final_url=final_url,
        status=status,
        content_type=media or sniff_text_type(body),
        body=body,
        encoding=charset,
        etag=headers.get("etag"),
        last_modified=headers.get("last-modified"),
        headers=kept_headers(headers),
    )
