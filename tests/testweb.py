"""The loopback test web: the demo corpus plus hostile pages, a SearxNG-compatible search
over all of it, and an OpenAI-compatible embeddings endpoint with real rate limits."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, field

import trafilatura

from webctx.adapters.hash_embedder import HashEmbedder
from webctx.demo.web import load_corpus
from webctx.devweb.embeddings import EmbeddingsControl, embeddings_control, make_embeddings_app
from webctx.devweb.pdfgen import bomb_pdf, encrypted_pdf, image_only_pdf, make_pdf, paginate
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, huge_page, make_site_app

MODEL = "hash-embedding"
TOPIC = (
    "Lithium-ion batteries degrade through SEI growth, lithium plating and cathode cracking; "
    "how battery degradation depends on temperature and fast charging. zqxv trapdoor."
)
# A question only the hostile pages answer: every source of its job fails.
TRAP_QUESTION = "zqxv trapdoor"

PDF = "application/pdf"
PDF_PATH = "/reports/battery-ageing-field-report.pdf"
PDF_TITLE = "Battery ageing field report"
PDF_PARAGRAPHS = [
    text.format(n=n, cells=400 + 25 * n, hot=40 + n, fade=2 + n % 3)
    for n in range(1, 9)
    for text in (
        "Part {n}: how do lithium-ion batteries degrade? This part follows {cells} "
        "lithium-ion batteries and names the mechanisms by which lithium-ion batteries "
        "degrade: growth of the solid electrolyte interphase (SEI), lithium plating during "
        "fast charging, and cracking of cathode particles.",
        "SEI growth in part {n} consumes cyclable lithium. Lithium-ion batteries degrade "
        "fastest through SEI growth at a high state of charge and a high temperature; at "
        "{hot} degrees Celsius the capacity fade of this group was {fade} times that at 25.",
        "Lithium plating, part {n}: when {cells} lithium-ion batteries are fast charged in "
        "the cold, lithium metal deposits on the graphite anode instead of entering it. "
        "Plated lithium is lost capacity, and dendrites can pierce the separator.",
    )
]  # several pages, no two paragraphs alike: chunks cite different pages
# path -> (page, title) of pages that must fail, each with a different outcome.
HOSTILE: dict[str, tuple[SitePage, str]] = {
    "/trap/slow.html": (
        SitePage(body="<html>late</html>", delay_s=30.0),
        "Battery degradation (slow)",
    ),
    "/trap/missing.html": (SitePage(body="gone", status=404), "Battery degradation (404)"),
    "/trap/error.html": (SitePage(body="oops", status=500), "Battery degradation (500)"),
    "/trap/huge.html": (huge_page(50_000_000), "Battery degradation (huge)"),
    "/trap/report.pdf": (
        SitePage(body=b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", content_type="application/pdf"),
        "Battery degradation report (PDF)",
    ),
    "/trap/locked.pdf": (
        SitePage(body=encrypted_pdf(), content_type=PDF),
        "Battery degradation report (encrypted PDF)",
    ),
    # 0.6 MB on the wire, 600 MB inflated: the reading process dies, the worker does not.
    "/trap/bomb.pdf": (
        SitePage(body=bomb_pdf(600 << 20), content_type=PDF),
        "Battery degradation report (PDF bomb)",
    ),
    "/trap/scan.pdf": (
        SitePage(body=image_only_pdf(), content_type=PDF),
        "Battery degradation report (scanned PDF)",
    ),
}


def report_pdf() -> bytes:
    """The field report as a PDF of several pages, with title, author and date."""
    return make_pdf(paginate(PDF_PARAGRAPHS), title=PDF_TITLE, author="Ada Volta",
                    created="D:20240315093000Z")  # fmt: skip


@dataclass
class LoopbackWeb:
    """Site, search and embeddings servers on loopback, with their hit counters."""

    site: LoopbackServer
    search: LoopbackServer
    embeddings: LoopbackServer
    hits: collections.Counter[str] = field(default_factory=collections.Counter)
    not_modified: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def embeddings_control(self) -> EmbeddingsControl:
        """Stats and fault injection of the embeddings server."""
        return embeddings_control(self.embeddings.app)  # type: ignore[arg-type]

    def env(self) -> dict[str, str]:
        """Environment pointing webctx at this web."""
        return {
            "WEBCTX_SEARCH_PROVIDER": "searxng",
            "WEBCTX_SEARXNG_URL": self.search.url,
            "OPENAI_BASE_URL": self.embeddings.url + "/v1",
            "OPENAI_API_KEY": "test-key",
            "WEBCTX_EMBEDDING_MODEL": MODEL,
            "WEBCTX_ALLOWED_NETWORKS": "127.0.0.1/32",
            "WEBCTX_FETCH__TOTAL_TIMEOUT_S": "3",
            "WEBCTX_FETCH__READ_TIMEOUT_S": "2",
            "WEBCTX_FETCH__MAX_BYTES": "2000000",
            "WEBCTX_FETCH__PER_HOST_DELAY_S": "0",  # our own loopback site: no pacing
        }

    def stop(self) -> None:
        """Stop all three servers."""
        for server in (self.site, self.search, self.embeddings):
            server.stop()


def start_test_web(
    *,
    rpm: int | None = 600,
    tpm: int | None = 2_000_000,
    extra: Mapping[str, tuple[SitePage, str, str]] | None = None,
) -> LoopbackWeb:
    """Start the three servers; hostile pages rank high for battery questions. `extra`
    adds pages by path: (page, title, the text search matches; empty: not searchable)."""
    corpus = load_corpus()
    extra = extra or {}
    pages = {p.path: SitePage(body=p.html) for p in corpus}
    pages.update({path: page for path, (page, _) in HOSTILE.items()})
    pages.update({path: page for path, (page, _, _) in extra.items()})
    pages[PDF_PATH] = SitePage(body=report_pdf(), content_type=PDF)
    hits: collections.Counter[str] = collections.Counter()
    not_modified: collections.Counter[str] = collections.Counter()
    site = LoopbackServer(make_site_app(pages, hits=hits, not_modified=not_modified)).start()
    docs = [
        SearchDoc(
            site.url + p.path,
            p.title,
            trafilatura.extract(p.html, include_comments=False) or "",
            p.published,
        )
        for p in corpus
    ]
    docs += [SearchDoc(site.url + path, title, TOPIC) for path, (_, title) in HOSTILE.items()]
    docs += [SearchDoc(site.url + path, title, text) for path, (_, title, text) in extra.items()
             if text]  # fmt: skip
    docs.append(SearchDoc(site.url + PDF_PATH, PDF_TITLE, " ".join(PDF_PARAGRAPHS[:3])))
    search = LoopbackServer(make_searxng_app(docs)).start()
    embed = HashEmbedder(model=MODEL).vectors
    embeddings = LoopbackServer(
        make_embeddings_app(embed, model=MODEL, rpm=rpm, tpm=tpm, window_s=10.0)
    ).start()
    return LoopbackWeb(site, search, embeddings, hits=hits, not_modified=not_modified)
