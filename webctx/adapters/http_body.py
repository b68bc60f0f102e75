"""Response-body helpers of the fetcher: capped inflation, content-type parsing, sniffing."""

from __future__ import annotations

import codecs
import re
import zlib
from collections.abc import Mapping

from webctx.errors import ContentTooLarge, UnsupportedContent

# fmt: off
_BINARY_MAGIC = (b"%PDF-", b"\x89PNG", b"GIF87a", b"GIF89a", b"\xff\xd8\xff", b"PK\x03\x04",
                 b"\x1f\x8b", b"OggS", b"\x7fELF", b"wOFF", b"wOF2", b"%!PS")
# fmt: on
_CHARSET = re.compile(r"charset\s*=\s*[\"']?([\w.:-]+)", re.I)
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
_CONTROL_BYTES = bytes(b for b in range(32) if b not in b"\t\n\r\f\x1b") + b"\x7f"


class BodyDecoder:
    """Undoes Content-Encoding chunk by chunk, never producing more than `limit` bytes."""

    def __init__(self, url: str, content_encoding: str, limit: int) -> None:
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
        self._size += len(data)
        if self._size > self._limit:
            raise ContentTooLarge(self._url, f"decoded body over {self._limit} bytes")
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
