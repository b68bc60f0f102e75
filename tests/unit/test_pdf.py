"""PDFs: text assembly with page offsets, the sandboxed reader on hostile files, the fetcher's
PDF path, page numbers in the bundle."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fetch_site import BIG_PDF, REPORT_LINES, SETTINGS, Site
from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.adapters.pdf_sandbox import PdfLimits, SandboxedPdfReader
from webctx.devweb import pdfgen
from webctx.errors import ContentTooLarge, UnreadablePdf, UnsupportedContent
from webctx.models import BundleStats, Chunk, Download, ScoredChunk
from webctx.stages.bundle import build_bundle, render_markdown, validate_offsets
from webctx.stages.chunk import chunk_page
from webctx.stages.fetch import extract_page, fetch_page
from webctx.stages.pdf import assemble_text, clean_page_text, pages_of, pdf_date

PARAGRAPHS = [
    f"Paragraph {n} says that lithium-ion cells lose capacity as the solid electrolyte "
    f"interphase grows, and that plating during cold fast charging removes lithium too."
    for n in range(40)
]


@pytest.fixture(scope="module")
def reader() -> Iterator[SandboxedPdfReader]:
    """The sandboxed reader with the default limits."""
    yield SandboxedPdfReader(PdfLimits())


def _download(body: bytes, url: str = "https://example.org/docs/report.pdf") -> Download:
    return Download(url=url, final_url=url, status=200, content_type="application/pdf",
                    body=body)  # fmt: skip


def test_assembled_text_keeps_page_starts_and_skips_empty_pages() -> None:
    text, starts = assemble_text(["First page.\r\nSecond line.", "", "  Third  page. "])
    assert text == "First page.\nSecond line.\n\nThird page."
    assert starts == [0, 24, 26]
    assert text[starts[2] :] == "Third page."
    assert pages_of(starts, 0, 5) == [1, 1]
    assert pages_of(starts, 20, 30) == [1, 3]  # page 2 is empty: the span runs on to page 3
    assert pages_of(starts, 27, 38) == [3, 3]


def test_page_text_joins_words_broken_at_line_ends_and_drops_controls() -> None:
    assert clean_page_text("inter\u0002\r\nphase and de-\r\ngradation\x00") == (
        "interphase and degradation"
    )
    assert clean_page_text("Li-\r\nIon") == "Li-\nIon"  # a capital after: a real hyphen


def test_pdf_dates_become_iso_dates() -> None:
    assert pdf_date("D:20240315093000Z") == "2024-03-15"
    assert pdf_date("D:2023") == "2023-01-01"
    assert pdf_date("D:20241341") is None
    assert pdf_date("yesterday") is None
    assert pdf_date(None) is None


def test_pdf_page_text_metadata_and_chunk_offsets(reader: SandboxedPdfReader) -> None:
    body = pdfgen.make_pdf(pdfgen.paginate(PARAGRAPHS), title="Cell ageing",
                           author="Ada Volta", created="D:20240315093000Z")  # fmt: skip
    page = extract_page(_download(body), pdf=reader)
    assert (page.title, page.author, page.published) == ("Cell ageing", "Ada Volta", "2024-03-15")
    assert page.page_starts is not None and len(page.page_starts) > 2
    for n, paragraph in enumerate(PARAGRAPHS):
        assert f"Paragraph {n} says" in page.text
        assert paragraph.split()[-1] in page.text
    chunks = chunk_page(page, max_tokens=64)
    assert all(page.text[c.start : c.end] == c.text for c in chunks)
    last = chunks[-1]
    assert pages_of(page.page_starts, last.start, last.end)[-1] == len(page.page_starts)


def test_pdf_without_metadata_is_titled_by_its_file_name(reader: SandboxedPdfReader) -> None:
    page = extract_page(_download(pdfgen.make_pdf(pdfgen.paginate(PARAGRAPHS[:3]))), pdf=reader)
    assert page.title == "report.pdf" and page.author is None and page.published is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (pdfgen.encrypted_pdf(), "encrypted"),
        (pdfgen.garbage_pdf(), "malformed"),
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", "malformed"),
        (pdfgen.many_pages_pdf(2000), "too_many_pages"),
        (pdfgen.image_only_pdf(), "no_text_layer"),
    ],
    ids=["encrypted", "garbage", "header-only", "2000-pages", "image-only"],
)
def test_hostile_pdf_fails_with_its_own_reason(
    reader: SandboxedPdfReader, body: bytes, reason: str
) -> None:
    with pytest.raises(UnreadablePdf) as info:
        extract_page(_download(body), pdf=reader)
    assert info.value.reason == reason


def test_decompression_bomb_ends_too_large_within_the_memory_cap(
    reader: SandboxedPdfReader,
) -> None:
    started = time.monotonic()
    with pytest.raises(UnreadablePdf) as info:
        reader.read(pdfgen.bomb_pdf(600 << 20), url="https://example.org/bomb.pdf")
    assert info.value.reason == "too_large"
    assert time.monotonic() - started < PdfLimits().timeout_s


def test_broken_cross_reference_table_is_repaired(reader: SandboxedPdfReader) -> None:
    body = pdfgen.broken_xref_pdf(pdfgen.paginate(PARAGRAPHS[:4]))
    assert "Paragraph 3 says" in extract_page(_download(body), pdf=reader).text


def test_pdf_over_the_wall_deadline_is_killed_as_timeout() -> None:
    # A file that takes seconds of parser CPU under a deadline of half a second, and a CPU
    # limit it cannot reach first: only the wall deadline can end it. (A quick file under a
    # tiny deadline raced the parent's own scheduling on a loaded machine.)
    slow = SandboxedPdfReader(PdfLimits(cpu_s=60, timeout_s=0.5))
    started = time.monotonic()
    with pytest.raises(UnreadablePdf, match="not read within") as info:
        slow.read(pdfgen.busy_pdf(40, 100_000), url="https://example.org/slow.pdf")
    assert info.value.reason == "timeout"
    assert time.monotonic() - started < 6.0
    # The reader stays usable after a kill.
    assert SandboxedPdfReader(PdfLimits()).read(pdfgen.many_pages_pdf(2), url="u").pages


def test_pdf_over_its_cpu_seconds_is_killed_as_timeout() -> None:
    busy = SandboxedPdfReader(PdfLimits(cpu_s=1, timeout_s=60))
    started = time.monotonic()
    with pytest.raises(UnreadablePdf, match="CPU seconds") as info:
        busy.read(pdfgen.busy_pdf(40, 100_000), url="https://example.org/busy.pdf")
    assert info.value.reason == "timeout"
    assert time.monotonic() - started < 30


def test_pdf_without_a_reader_stays_unsupported() -> None:
    with pytest.raises(UnsupportedContent):
        extract_page(_download(pdfgen.make_pdf([["text"]])))


def test_fetcher_reads_pdf_over_the_page_cap_up_to_the_pdf_cap(
    site: Site, fetcher: HttpxFetcher, reader: SandboxedPdfReader
) -> None:
    assert SETTINGS.max_bytes < len(BIG_PDF) < SETTINGS.pdf_max_bytes
    page = fetch_page(site.url("/big.pdf"), fetcher, pdf=reader)
    assert page.page_starts is not None and len(page.page_starts) > 10


def test_fetcher_caps_pdf_at_the_pdf_cap(site: Site) -> None:
    from tests.fetch_site import LOOPBACK_ONLY, no_dns

    small = SETTINGS.model_copy(update={"pdf_max_bytes": 100_000})
    capped = HttpxFetcher(small, policy=LOOPBACK_ONLY, resolver=no_dns)
    try:
        with pytest.raises(ContentTooLarge):
            capped.fetch(site.url("/big.pdf"))
    finally:
        capped.close()


def test_octet_stream_at_a_pdf_path_is_read_as_pdf(
    site: Site, fetcher: HttpxFetcher, reader: SandboxedPdfReader
) -> None:
    download = fetcher.fetch(site.url("/files/report.pdf"))
    assert download.content_type == "application/pdf"
    page = extract_page(download, pdf=reader)
    assert REPORT_LINES[0] in page.text and page.title == "Lithium plating"


def test_bundle_chunks_of_a_pdf_carry_their_pages(reader: SandboxedPdfReader) -> None:
    page = extract_page(_download(pdfgen.make_pdf(pdfgen.paginate(PARAGRAPHS))), pdf=reader)
    assert page.page_starts is not None
    chunks = chunk_page(page, max_tokens=64)
    picked: list[Chunk] = [chunks[0], chunks[-1]]
    ranked = [ScoredChunk(chunk=c, url=page.url, score=1.0 - i / 10) for i, c in enumerate(picked)]
    bundle = build_bundle(job_id="j", question="q", queries=["q"],
                          pages={page.content_sha256: page}, ranked=ranked, failures=[],
                          stats=BundleStats())  # fmt: skip
    assert validate_offsets(bundle, {page.content_sha256: page}) == []
    last = len(page.page_starts)
    assert [c.pages for c in bundle.chunks] == [[1, 1], [last, last]]
    shown = render_markdown(bundle)
    assert "**[1, p. 1]**" in shown and f"**[1, p. {last}]**" in shown


def test_a_temp_dir_too_long_for_the_fork_servers_socket_still_reads_pdfs(
    tmp_path: Path,
) -> None:
    # multiprocessing puts the fork server's unix socket under the temp dir; a long TMPDIR
    # made every PDF fail "AF_UNIX path too long" (seen with a job run in a scratch TMPDIR).
    import os
    import subprocess
    import sys

    long_tmp = tmp_path / ("t" * 80)
    long_tmp.mkdir()
    script = (
        "from webctx.adapters.pdf_sandbox import PdfLimits, SandboxedPdfReader\n"
        "from webctx.devweb import pdfgen\n"
        "body = pdfgen.make_pdf(pdfgen.paginate(['Tide tables list high water.']))\n"
        "print(SandboxedPdfReader(PdfLimits()).read(body, url='https://e.org/a.pdf').pages)\n"
    )
    env = {**os.environ, "TMPDIR": str(long_tmp)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Tide tables list high water." in done.stdout
