"""The loopback QA web of the answer-recall benchmark: SQuAD pages as a site, a
SearxNG-compatible BM25 search over them, and an OpenAI-compatible embeddings endpoint
backed by all-MiniLM-L6-v2 with an on-disk vector cache (bench/out/, keyed by text hash).

Data: `shared/data/qa/` (docs.jsonl, queries.jsonl; see its SOURCE.md), located as
`../shared/data` beside the repo or `$WEBCTX_BENCH_DATA`.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from webctx.devweb.embeddings import make_embeddings_app
from webctx.devweb.searxng import SearchDoc, make_searxng_app
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.protocols import Embedder, Embeddings

ROOT = Path(__file__).resolve().parent.parent
# Vector cache; $WEBCTX_BENCH_OUT points elsewhere (e.g. an empty folder for a cold run).
OUT = Path(os.environ.get("WEBCTX_BENCH_OUT") or ROOT / "bench" / "out")
MODEL = "all-MiniLM-L6-v2"
DIMENSIONS = 384
_TAG = re.compile(r"<[^>]+>")


def data_dir() -> Path:
    """The shared benchmark data: $WEBCTX_BENCH_DATA, else ../shared/data beside the repo."""
    env = os.environ.get("WEBCTX_BENCH_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


@dataclass(frozen=True)
class QADoc:
    """One page: a Wikipedia article as SQuAD has it, paragraphs split by blank lines."""

    id: str
    title: str
    url_path: str
    text: str


@dataclass(frozen=True)
class Question:
    """One question with its answer strings and the page it came from."""

    id: str
    question: str
    answers: list[str]
    doc_id: str


def load_qa(root: Path) -> tuple[list[QADoc], list[Question]] | None:
    """The docs and questions, or None when the data is not there."""
    if not (root / "docs.jsonl").exists() or not (root / "queries.jsonl").exists():
        return None
    docs = [QADoc(**{k: d[k] for k in ("id", "title", "url_path", "text")})
            for d in map(json.loads, (root / "docs.jsonl").read_text().splitlines())]  # fmt: skip
    questions = [
        Question(q["id"], q["question"], q["answers"], q["doc_id"])
        for q in map(json.loads, (root / "queries.jsonl").read_text().splitlines())
    ]
    return docs, questions


def shared_qa() -> tuple[list[QADoc], list[Question]] | None:
    """The shared QA web's docs and questions (`data_dir()`/qa), or None after saying on
    stdout that there is nothing to measure without them."""
    loaded = load_qa(data_dir() / "qa")
    if loaded is None:
        print(f"no QA data at {data_dir() / 'qa'}: nothing to measure")  # noqa: T201
    return loaded


def render_html(doc: QADoc) -> str:
    """A page as a site would serve it: navigation and footer around the article."""
    title = html.escape(doc.title)
    paragraphs = "\n".join(f"<p>{html.escape(p)}</p>" for p in doc.text.split("\n\n"))
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}'
        f'</title></head><body><nav><a href="/">Home</a> | <a href="/random">Random '
        f'article</a> | <a href="/about">About</a></nav>\n<main><article><h1>{title}</h1>\n'
        f"{paragraphs}\n</article></main>\n<footer>Text is available under the Creative "
        f"Commons Attribution-ShareAlike License. Privacy policy.</footer></body></html>"
    )


def visible_text(markup: str) -> str:
    """The text of served HTML, whitespace-normalised (for verbatim-quote checks)."""
    return normalize(html.unescape(_TAG.sub(" ", markup)))


def normalize(text: str) -> str:
    """Whitespace-collapsed, lower-cased text (the answer-match normal form)."""
    return " ".join(text.split()).casefold()


class VectorCache:
    """Vectors by sha256 of the exact text, appended to one binary file as they are made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._vectors: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()
        record = 32 + 4 * DIMENSIONS
        if path.exists():
            raw = path.read_bytes()
            for at in range(0, len(raw) - len(raw) % record, record):
                vec = np.frombuffer(raw[at + 32 : at + record], dtype="<f4")
                self._vectors[raw[at : at + 32]] = vec

    def __len__(self) -> int:
        return len(self._vectors)

    def lookup(self, texts: Sequence[str]) -> list[np.ndarray | None]:
        """The cached vector of each text, or None."""
        return [self._vectors.get(_key(t)) for t in texts]

    def add(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Remember and persist new vectors."""
        with self._lock:
            records = []
            for text, vec in zip(texts, vectors, strict=True):
                key = _key(text)
                if key not in self._vectors:
                    row = np.asarray(vec, dtype="<f4")
                    self._vectors[key] = row
                    records.append(key + row.tobytes())
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # One unbuffered append per batch: whole records even if two runs share the file.
            with self.path.open("ab", buffering=0) as out:
                out.write(b"".join(records))


def _key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def _backend_suffix() -> str:
    """The vector cache's name part for $WEBCTX_BENCH_LOCAL_BACKEND (none for torch); int8
    names the quantization recipe too, so vectors of older int8 weights are not reused."""
    from webctx.adapters.onnx_export import RECIPE

    backend = os.environ.get("WEBCTX_BENCH_LOCAL_BACKEND", "torch")
    if backend == "onnx-int8":
        return f"-{backend}-r{RECIPE}"
    return "" if backend == "torch" else f"-{backend}"


def _local_embedder() -> Embedder:
    """The local model on $WEBCTX_BENCH_LOCAL_BACKEND: torch (default), onnx or onnx-int8."""
    from webctx.settings import EmbedSettings
    from webctx.workers.deps import build_local_embedder

    backend = os.environ.get("WEBCTX_BENCH_LOCAL_BACKEND", "torch")
    return build_local_embedder(EmbedSettings(local_backend=backend))  # type: ignore[arg-type]


class CachedMiniLM:
    """all-MiniLM-L6-v2 on CPU, each distinct text embedded once (cache on disk)."""

    def __init__(self, cache: VectorCache) -> None:

        self.cache = cache
        self.model = MODEL
        self._local: Embedder | None = None  # loaded at the first text not cached
        self._lock = threading.Lock()
        self.computed = 0

    def embed(self, texts: list[str]) -> Embeddings:
        """Vectors for `texts`, computing only the ones not cached."""
        found = self.cache.lookup(texts)
        missing = sorted({t for t, v in zip(texts, found, strict=True) if v is None})
        if missing:
            with self._lock:  # one model run at a time: 2 cores
                if self._local is None:
                    self._local = _local_embedder()
                fresh = np.asarray(self._local.embed(missing).vectors, dtype=np.float32)
                self.cache.add(missing, fresh)
                self.computed += len(missing)
            found = self.cache.lookup(texts)
        return Embeddings([np.asarray(v, dtype=np.float64).tolist() for v in found
                           if v is not None])  # fmt: skip


@dataclass
class QAWeb:
    """Site, search and embeddings servers on loopback over the QA pages."""

    site: LoopbackServer
    search: LoopbackServer
    embeddings: LoopbackServer
    served: dict[str, str]  # url -> HTML as served
    embedder: CachedMiniLM
    docs: dict[str, QADoc] = field(default_factory=dict)

    def stop(self) -> None:
        """Stop all three servers."""
        for server in (self.site, self.search, self.embeddings):
            server.stop()


def start_qa_web(docs: Sequence[QADoc], *, down: Collection[str] = ()) -> QAWeb:
    """Start the three servers over `docs`; the pages at the paths `down` answer 503."""
    markup = {d.url_path: render_html(d) for d in docs}
    site = LoopbackServer(make_site_app({
        p: SitePage(body="unavailable", status=503, content_type="text/plain") if p in down
        else SitePage(body=m) for p, m in markup.items()}))  # fmt: skip
    site.start()
    # SOURCE.md: the search is BM25 over title + text of every page.
    search_docs = [SearchDoc(site.url + d.url_path, d.title, d.text) for d in docs]
    search = LoopbackServer(make_searxng_app(search_docs)).start()
    embedder = CachedMiniLM(VectorCache(OUT / f"qa-vectors-{MODEL}{_backend_suffix()}.bin"))
    embeddings = LoopbackServer(
        make_embeddings_app(
            lambda texts: embedder.embed(texts).vectors, model=MODEL, rpm=None, tpm=None
        )  # fmt: skip
    ).start()
    served = {site.url + p: m for p, m in markup.items()}
    return QAWeb(
        site, search, embeddings, served, embedder, {site.url + d.url_path: d for d in docs}
    )
