"""PDFs with known text, written by hand at run time: tests, the bench and the demo web serve
them instead of binary files. Also the hostile ones a PDF extractor must survive: encrypted,
garbage, a broken cross-reference table, a decompression bomb, thousands of pages, a page
with no text layer.

Only Latin-1 text (Helvetica with WinAnsiEncoding); one line of text per `Tj`, top down.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

_LEADING = 14
_TOP = 760
_LINES_PER_PAGE = 50


def _escape(line: str) -> bytes:
    raw = line.encode("latin-1", errors="replace")
    return raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def _content(lines: Sequence[str]) -> bytes:
    ops = [b"BT /F1 11 Tf %d TL 72 %d Td" % (_LEADING, _TOP)]
    ops += [b"(" + _escape(line) + b") Tj T*" for line in lines]
    ops.append(b"ET")
    return b"\n".join(ops)


def _stream(data: bytes, *, compress: bool, extra: bytes = b"") -> bytes:
    if compress:
        data = zlib.compress(data)
        extra += b" /Filter /FlateDecode"
    return b"<< /Length %d%s >>\nstream\n%s\nendstream" % (len(data), extra, data)


def _pdf_string(text: str) -> bytes:
    return b"(" + _escape(text) + b")"


def _assemble(objects: Sequence[bytes], *, trailer_extra: bytes = b"", xref: bool = True) -> bytes:
    """Objects 1..n (1 is the catalog) with a cross-reference table and trailer."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    start = len(out)
    if xref:
        out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
        out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\n" % (len(objects) + 1, trailer_extra)
    out += b"startxref\n%d\n%%%%EOF\n" % start
    return bytes(out)


def make_pdf(
    pages: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    author: str | None = None,
    created: str | None = None,
    compress: bool = True,
) -> bytes:
    """A PDF whose page i shows `pages[i]`, one line each; `created` as D:YYYYMMDD."""
    return _pages_pdf([_content(lines) for lines in pages], title=title, author=author,
                      created=created, compress=compress)  # fmt: skip


def _pages_pdf(
    contents: Sequence[bytes],
    *,
    title: str | None = None,
    author: str | None = None,
    created: str | None = None,
    compress: bool = True,
    resources: bytes = b"<< /Font << /F1 3 0 R >> >>",
    extra_objects: Sequence[bytes] = (),
    trailer_extra: bytes = b"",
    xref: bool = True,
) -> bytes:
    n = len(contents)
    first = 4 + len(extra_objects)  # 1 catalog, 2 page tree, 3 font, extras, then pages
    kids = b" ".join(b"%d 0 R" % (first + 2 * i) for i in range(n))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, n),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        *extra_objects,
    ]
    for i, content in enumerate(contents):
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources %s "
            b"/Contents %d 0 R >>" % (resources, first + 2 * i + 1)
        )
        objects.append(_stream(content, compress=compress))
    info = [(b"Title", title), (b"Author", author), (b"CreationDate", created)]
    entries = b" ".join(b"/" + key + b" " + _pdf_string(value) for key, value in info if value)
    if entries:
        objects.append(b"<< " + entries + b" >>")
        trailer_extra = b" /Info %d 0 R" % len(objects) + trailer_extra
    return _assemble(objects, trailer_extra=trailer_extra, xref=xref)


def paginate(paragraphs: Sequence[str], *, width: int = 90) -> list[list[str]]:
    """Paragraphs wrapped at `width` characters and laid out on pages, a blank line between."""
    lines: list[str] = []
    for paragraph in paragraphs:
        line = ""
        for word in paragraph.split():
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines += [line, ""]
    pages = [lines[i : i + _LINES_PER_PAGE] for i in range(0, len(lines), _LINES_PER_PAGE)]
    return pages or [[]]


def encrypted_pdf() -> bytes:
    """A PDF under the standard security handler whose user password is not empty."""
    encrypt = (b"<< /Filter /Standard /V 1 /R 2 /P -44 /O <%s> /U <%s> >>"
               % (b"6f" * 32, b"75" * 32))  # fmt: skip
    return _pages_pdf(
        [_content(["Secret text nobody may read."])],
        extra_objects=[encrypt],
        trailer_extra=b" /Encrypt 4 0 R /ID [<%s> <%s>]" % (b"ab" * 16, b"ab" * 16),
    )


def garbage_pdf() -> bytes:
    """A PDF header over bytes that hold no object at all."""
    return b"%PDF-1.7\n" + bytes(range(256)) * 64 + b"\n%%EOF\n"


def broken_xref_pdf(pages: Sequence[Sequence[str]]) -> bytes:
    """A PDF whose cross-reference table points every object at a wrong offset."""
    good = make_pdf(pages)
    head, _, tail = good.partition(b"xref\n")
    table, _, trailer = tail.partition(b"trailer\n")
    rows = table.split(b"\n")
    broken = [rows[0], rows[1]] + [b"%010d 00000 n " % (7 * i + 3) for i in range(len(rows) - 3)]
    return head + b"xref\n" + b"\n".join(broken) + b"\ntrailer\n" + trailer


def bomb_pdf(inflated_bytes: int) -> bytes:
    """One page whose content stream is ~1/1000 of `inflated_bytes` deflated, all of it
    inflated. Built fast: after a full flush, deflate encodes each equal block alike."""
    head = _content(["A bomb lies below."]) + b"\n"
    block = b" " * (1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = compressor.compress(head) + compressor.flush(zlib.Z_FULL_FLUSH)
    packed = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = max(1, inflated_bytes >> 20)
    checksum = zlib.adler32(head)
    for _ in range(count):
        checksum = zlib.adler32(block, checksum)
    data = (b"\x78\xda" + first + packed * count + compressor.flush()
            + checksum.to_bytes(4, "big"))  # fmt: skip
    stream = b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(data), data)
    return _pages_pdf([b""], extra_objects=[stream]).replace(b"/Contents 6 0 R", b"/Contents 4 0 R")


def many_pages_pdf(count: int) -> bytes:
    """`count` pages of one short line each."""
    return make_pdf([[f"Page {n} of {count}."] for n in range(1, count + 1)])


def busy_pdf(pages: int, ops: int) -> bytes:
    """`pages` pages sharing one content stream of `ops` text operators: seconds of parser
    CPU time in a few kB."""
    content = b"BT /F1 11 Tf " + b"1 0 0 1 72 700 Tm (ab) Tj " * ops + b"ET"
    kids = b" ".join(b"%d 0 R" % (5 + i) for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        _stream(content, compress=True),
    ]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources "
                b"<< /Font << /F1 3 0 R >> >> /Contents 4 0 R >>"] * pages  # fmt: skip
    return _assemble(objects)


def image_only_pdf() -> bytes:
    """A scan: one page painted with an image, no text layer."""
    pixels = bytes((x * 7 + y * 3) % 256 for y in range(64) for x in range(64))
    image = _stream(pixels, compress=True,
                    extra=b" /Type /XObject /Subtype /Image /Width 64 /Height 64"
                          b" /ColorSpace /DeviceGray /BitsPerComponent 8")  # fmt: skip
    return _pages_pdf(
        [b"q 468 0 0 648 72 72 cm /Im1 Do Q"],
        resources=b"<< /XObject << /Im1 4 0 R >> >>",
        extra_objects=[image],
    )
