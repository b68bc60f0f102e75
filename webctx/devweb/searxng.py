"""A SearxNG-compatible `/search` endpoint over a fixed corpus, ranked by BM25.

It answers like a SearxNG instance with `search.formats: [json]` enabled: the same
JSON shape, `pageno` paging, a fixed page size, and 403 for other formats.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from webctx.devweb.server import InFlight

_WORD = re.compile(r"\w+", re.UNICODE)
ENGINE = "devweb"


@dataclass(frozen=True)
class SearchDoc:
    """One document the dev search engine can return."""

    url: str
    title: str
    text: str
    published: str | None = None


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens."""
    return [w.lower() for w in _WORD.findall(text)]


class BM25Index:
    """Okapi BM25 over title+text; title terms count `title_boost` times."""

    def __init__(
        self, docs: Sequence[SearchDoc], *, k1: float = 1.2, b: float = 0.75, title_boost: int = 3
    ) -> None:
        self.docs = list(docs)
        self.k1, self.b = k1, b
        # Repeating title terms is the simple BM25F: it raises tf and length together.
        self._tfs = [Counter(tokenize(d.text) + tokenize(d.title) * title_boost) for d in self.docs]
        self._lens = [sum(tf.values()) for tf in self._tfs]
        self._avg_len = (sum(self._lens) / len(self._lens)) if self._lens else 0.0
        df: Counter[str] = Counter()
        for tf in self._tfs:
            df.update(tf.keys())
        n = len(self.docs)
        self._idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def search(self, query: str) -> list[tuple[SearchDoc, float]]:
        """Documents matching any query term, best score first (ties keep corpus order)."""
        terms = set(tokenize(query))
        scored: list[tuple[float, int]] = []
        for i, tf in enumerate(self._tfs):
            norm = self.k1 * (1 - self.b + self.b * self._lens[i] / (self._avg_len or 1.0))
            score = sum(
                self._idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in terms if t in tf
            )
            if score > 0:
                scored.append((score, i))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [(self.docs[i], score) for score, i in scored]


@dataclass
class SearxngControl:
    """Counters and fault injection of one dev SearxNG app (thread-safe)."""

    requests: int = 0
    queries: list[str] = field(default_factory=list)
    in_flight: InFlight = field(default_factory=InFlight)
    """Requests in their latency at once."""
    _faults: list[tuple[int, float | None]] = field(default_factory=list)
    _always: tuple[int, float | None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail_next(self, n: int = 1, *, status: int = 500, retry_after: float | None = None) -> None:
        """Answer the next `n` searches with `status` (and `retry-after` when given)."""
        with self._lock:
            self._faults.extend([(status, retry_after)] * n)

    def fail_always(self, *, status: int = 500, retry_after: float | None = None) -> None:
        """Answer every search with `status` until `recover()`."""
        with self._lock:
            self._always = (status, retry_after)

    def recover(self) -> None:
        """Drop every injected fault: answer normally again."""
        with self._lock:
            self._faults.clear()
            self._always = None

    def _record(self, query: str) -> tuple[int, float | None] | None:
        with self._lock:
            self.requests += 1
            self.queries.append(query)
            return self._faults.pop(0) if self._faults else self._always


def _result(doc: SearchDoc, score: float, position: int) -> dict[str, Any]:
    """One result in SearxNG's JSON shape."""
    return {
        "url": doc.url,
        "title": doc.title,
        "content": doc.text[:300],
        "engine": ENGINE,
        "engines": [ENGINE],
        "positions": [position],
        "score": round(score, 6),
        "category": "general",
        "publishedDate": doc.published,
    }


def _fault_response(status: int, retry_after: float | None) -> Response:
    headers = {"retry-after": str(math.ceil(retry_after))} if retry_after is not None else {}
    return PlainTextResponse(f"injected fault {status}", status_code=status, headers=headers)


# SearxNG's time ranges; like its engines, an undated document is never "recent".
_TIME_RANGES = {"day": 1, "week": 7, "month": 31, "year": 365}


def _published_within(doc: SearchDoc, days: int) -> bool:
    if not doc.published:
        return False
    try:
        published = datetime.fromisoformat(doc.published)
    except ValueError:
        return False
    if published.tzinfo is None:
        published = published.replace(tzinfo=UTC)
    return datetime.now(UTC) - published <= timedelta(days=days)


def make_searxng_app(
    docs: Sequence[SearchDoc], *, results_per_page: int = 10, latency_s: float = 0.0
) -> Starlette:
    """A Starlette app serving `GET /search?q=...&format=json&pageno=N` over `docs`, each
    answer after `latency_s` (a real instance asks its engines for every page)."""
    index = BM25Index(docs)
    control = SearxngControl()

    async def search(request: Request) -> Response:
        params = request.query_params
        query = params.get("q", "").strip()
        fault = control._record(query)
        if fault is not None:
            return _fault_response(*fault)
        with control.in_flight.answering():
            if latency_s:
                await asyncio.sleep(latency_s)
        if params.get("format") != "json":
            # SearxNG answers 403 for any format missing from `search.formats`.
            return PlainTextResponse("Forbidden", status_code=403)
        if not query:
            return PlainTextResponse("Bad Request: empty query", status_code=400)
        try:
            pageno = max(1, int(params.get("pageno", "1")))
        except ValueError:
            return PlainTextResponse("Bad Request: pageno", status_code=400)
        hits = index.search(query)
        if params.get("time_range"):
            window = _TIME_RANGES.get(params["time_range"])
            if window is None:
                return PlainTextResponse("Bad Request: time_range", status_code=400)
            hits = [(d, s) for d, s in hits if _published_within(d, window)]
        start = (pageno - 1) * results_per_page
        page = hits[start : start + results_per_page]
        body = {
            "query": query,
            "number_of_results": len(hits),
            "results": [_result(d, s, start + i + 1) for i, (d, s) in enumerate(page)],
            "answers": [],
            "corrections": [],
            "infoboxes": [],
            "suggestions": [],
            "unresponsive_engines": [],
        }
        return JSONResponse(body)

    app = Starlette(routes=[Route("/search", search, methods=["GET"])])
    app.state.control = control
    return app


def searxng_control(app: Starlette) -> SearxngControl:
    """The counters and fault switch of an app made by `make_searxng_app`."""
    control = app.state.control
    if not isinstance(control, SearxngControl):
        raise TypeError("not a dev SearxNG app")
    return control
