"""The demo web: the bundled corpus as a site, a SearxNG-compatible search over it and an
OpenAI-compatible embeddings endpoint, each on its own loopback port."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from types import TracebackType

import trafilatura

from webctx.adapters.hash_embedder import HashEmbedder
from webctx.devweb.embeddings import make_embeddings_app
from webctx.devweb.pdfgen import make_pdf, paginate
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app

EMBEDDING_MODEL = "hash-embedding"
PDF_SOURCE = "calendar-vs-cycle-ageing"
"""The corpus page also served as a PDF report (the demo cites PDFs with their pages)."""


@dataclass(frozen=True)
class CorpusPage:
    """One page of the bundled corpus."""

    path: str
    html: str
    title: str
    published: str | None


def load_corpus() -> list[CorpusPage]:
    """Every page listed in the corpus manifest."""
    root = resources.files("webctx.demo").joinpath("corpus")
    manifest = json.loads(root.joinpath("manifest.json").read_text(encoding="utf-8"))
    return [
        CorpusPage(
            path=item["path"],
            html=root.joinpath(item["file"]).read_text(encoding="utf-8"),
            title=item["title"],
            published=item.get("published"),
        )
        for item in manifest
    ]


def _as_pdf(page: CorpusPage) -> tuple[str, str, bytes, str]:
    """A corpus page as a PDF report: its path, title, PDF bytes and text."""
    text = trafilatura.extract(page.html, include_comments=False) or ""
    title = f"{page.title} (report)"
    body = make_pdf(paginate(text.split("\n"), width=80), title=title, author="webctx demo",
                    created=f"D:{(page.published or '2024-01-01').replace('-', '')}")  # fmt: skip
    path = "/reports/" + page.path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".html") + ".pdf"
    return path, title, body, text


@dataclass
class DemoWeb:
    """The three loopback servers of the demo; use as a context manager."""

    pages: list[CorpusPage] = field(default_factory=load_corpus)
    site: LoopbackServer | None = None
    search: LoopbackServer | None = None
    embeddings: LoopbackServer | None = None

    def start(self) -> DemoWeb:
        """Start the site, then search (indexing the site's URLs), then embeddings."""
        pages = {p.path: SitePage(body=p.html) for p in self.pages}
        reports = [_as_pdf(p) for p in self.pages if PDF_SOURCE in p.path]
        pages.update({path: SitePage(body=body, content_type="application/pdf")
                      for path, _, body, _ in reports})  # fmt: skip
        self.site = LoopbackServer(make_site_app(pages)).start()
        docs = [
            SearchDoc(
                url=self.site.url + p.path,
                title=p.title,
                text=trafilatura.extract(p.html, include_comments=False) or "",
                published=p.published,
            )
            for p in self.pages
        ]
        docs += [SearchDoc(self.site.url + path, title, text) for path, title, _, text in reports]
        self.search = LoopbackServer(make_searxng_app(docs)).start()
        embedder = HashEmbedder(model=EMBEDDING_MODEL)
        app = make_embeddings_app(embedder.vectors, model=EMBEDDING_MODEL, rpm=None, tpm=None)
        self.embeddings = LoopbackServer(app).start()
        return self

    def env(self) -> dict[str, str]:
        """Environment that points webctx at this web (embedded mode)."""
        assert self.site and self.search and self.embeddings
        return {
            "WEBCTX_SEARCH_PROVIDER": "searxng",
            "WEBCTX_SEARXNG_URL": self.search.url,
            "OPENAI_BASE_URL": self.embeddings.url + "/v1",
            "OPENAI_API_KEY": "demo-key",
            "WEBCTX_EMBEDDING_MODEL": EMBEDDING_MODEL,
            "WEBCTX_ALLOWED_NETWORKS": "127.0.0.1/32",
            "WEBCTX_FETCH__PER_HOST_DELAY_S": "0",  # our own loopback site: no pacing
        }

    def stop(self) -> None:
        """Stop every server."""
        for server in (self.embeddings, self.search, self.site):
            if server is not None:
                server.stop()

    def __enter__(self) -> DemoWeb:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
