"""Loopback fakes of the keyed search APIs (Brave, Tavily, Exa, Serper) over a fixed corpus,
ranked by BM25: each vendor's path, auth header, request fields, result shape, and its
error answers (a refused key, 429 with the vendor's headers, spent credits, 5xx, a
malformed body), as the vendors document them.

`make_vendor_app(vendor, docs, api_key=...)`; `vendor_control(app)` injects faults and
reads what was asked (`requests`, `last`)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from webctx.devweb.searxng import BM25Index, SearchDoc, _published_within

Vendor = Literal["brave", "tavily", "exa", "serper"]
Fault = Literal["auth", "rate", "spent", "server", "malformed"]
VENDORS: tuple[Vendor, ...] = ("brave", "tavily", "exa", "serper")
PATHS = {"brave": "/res/v1/web/search", "tavily": "/search", "exa": "/search",
         "serper": "/search"}  # fmt: skip
_DAYS = {"pd": 1, "pw": 7, "pm": 31, "py": 365, "day": 1, "week": 7, "month": 31,
         "year": 365, "d": 1, "w": 7, "m": 31, "y": 365, "qdr:d": 1, "qdr:w": 7, "qdr:m": 31,
         "qdr:y": 365}  # fmt: skip


@dataclass
class VendorControl:
    """Counters, the last request and fault injection of one vendor fake (thread-safe)."""

    requests: int = 0
    last: dict[str, Any] = field(default_factory=dict)
    """The last request: `headers` (lower-cased), `params` (query string), `body` (JSON)."""
    latency_s: float = 0.0
    _faults: list[Fault] = field(default_factory=list)
    _always: Fault | None = None
    _every: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail_next(self, n: int = 1, *, fault: Fault = "server") -> None:
        """Answer the next `n` searches with `fault`."""
        with self._lock:
            self._faults.extend([fault] * n)

    def fail_always(self, *, fault: Fault = "server") -> None:
        """Answer every search with `fault` until `recover()`."""
        with self._lock:
            self._always = fault

    def fail_every(self, k: int, *, fault: Fault = "server") -> None:
        """Answer every `k`-th search (the 1st, the k+1-th…) with `fault`: 2 fails half."""
        with self._lock:
            self._every, self._always = k, None
            self._every_fault: Fault = fault

    def recover(self) -> None:
        """Answer normally again."""
        with self._lock:
            self._faults.clear()
            self._always, self._every = None, 0

    def _record(self, last: dict[str, Any]) -> Fault | None:
        with self._lock:
            self.requests += 1
            self.last = last
            if self._faults:
                return self._faults.pop(0)
            if self._every and (self.requests - 1) % self._every == 0:
                return self._every_fault
            return self._always


def _brave(hits: list[tuple[SearchDoc, float]], req: dict[str, Any]) -> dict[str, Any]:
    params = req["params"]
    count, offset = int(params.get("count", 20)), int(params.get("offset", 0))
    page = hits[offset * count : (offset + 1) * count]
    results = [{"type": "search_result", "subtype": "generic", "title": d.title, "url": d.url,
                "description": f"<strong>{d.title}</strong> {d.text[:250]}",
                "page_age": d.published, "language": "en", "family_friendly": True}
               for d, _ in page]  # fmt: skip
    answer: dict[str, Any] = {
        "type": "search",
        "query": {
            "original": params.get("q", ""),
            "more_results_available": len(hits) > (offset + 1) * count,
        },
    }
    if results:  # Brave leaves `web` out when it has no web results
        answer["web"] = {"type": "search", "results": results, "family_friendly": True}
    return answer


def _tavily(hits: list[tuple[SearchDoc, float]], req: dict[str, Any]) -> dict[str, Any]:
    body = req["body"]
    raw = body.get("include_raw_content") not in (None, False)
    results = [{"title": d.title, "url": d.url, "content": d.text[:300], "score": round(s, 4),
                "raw_content": d.text if raw else None, "favicon": None}
               for d, s in hits[: int(body.get("max_results", 5))]]  # fmt: skip
    return {"query": body.get("query"), "answer": None, "images": [], "results": results,
            "response_time": 0.01, "request_id": "fake"}  # fmt: skip


def _exa(hits: list[tuple[SearchDoc, float]], req: dict[str, Any]) -> dict[str, Any]:
    body = req["body"]
    text = (body.get("contents") or {}).get("text") or {}
    limit = int(text.get("maxCharacters", 0)) if isinstance(text, dict) else 0
    results = []
    for d, s in hits[: int(body.get("numResults", 10))]:
        item = {"id": d.url, "url": d.url, "title": d.title, "publishedDate": d.published,
                "author": None, "score": round(s, 4)}  # fmt: skip
        if limit:
            item["text"] = d.text[:limit]
        results.append(item)
    return {"requestId": "fake", "resolvedSearchType": "neural", "results": results,
            "costDollars": {"total": 0.005}}  # fmt: skip


def _serper(hits: list[tuple[SearchDoc, float]], req: dict[str, Any]) -> dict[str, Any]:
    body = req["body"]
    num, page = int(body.get("num", 10)), int(body.get("page", 1))
    organic = [{"title": d.title, "link": d.url, "snippet": d.text[:200], "position": i + 1,
                "date": d.published}
               for i, (d, _) in enumerate(hits[(page - 1) * num : page * num])]  # fmt: skip
    return {"searchParameters": {"q": body.get("q"), "type": "search", "num": num,
                                 "engine": "google"}, "organic": organic, "credits": 1}  # fmt: skip


_ANSWERS: dict[str, Callable[[list[tuple[SearchDoc, float]], dict[str, Any]], dict[str, Any]]] = {
    "brave": _brave, "tavily": _tavily, "exa": _exa, "serper": _serper}  # fmt: skip


def _brave_error(status: int, code: str, detail: str, meta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "ErrorResponse", "error": {"id": "fake", "status": status, "code": code,
            "detail": detail, "meta": meta}, "time": 0}  # fmt: skip


_BRAVE_LIMITS = {"X-RateLimit-Limit": "1, 15000", "X-RateLimit-Policy": "1;w=1, 15000;w=2592000",
                 "X-RateLimit-Remaining": "0, 1000", "X-RateLimit-Reset": "1, 1419704"}  # fmt: skip


def fault_response(vendor: Vendor, fault: Fault) -> Response:
    """The vendor's answer for `fault`, with its documented status, body and headers."""
    if fault == "malformed":
        return PlainTextResponse("<html>upstream proxy error</html>", status_code=200,
                                 media_type="application/json")  # fmt: skip
    if fault == "server":
        return JSONResponse(
            {"error": "internal error"}, status_code=503 if vendor == "exa" else 500
        )
    table: dict[tuple[str, str], tuple[int, dict[str, Any], dict[str, str]]] = {
        ("brave", "auth"): (422, _brave_error(422, "SUBSCRIPTION_TOKEN_INVALID",
                            "The provided subscription token is invalid.", {}), {}),
        ("brave", "rate"): (429, _brave_error(429, "RATE_LIMITED", "Request rate limit exceeded "
                            "for plan", {"plan": "Free", "rate_limit": 1, "rate_current": 1,
                            "quota_limit": 2000, "quota_current": 15,
                            "component": "rate_limiter"}), _BRAVE_LIMITS),
        ("brave", "spent"): (429, _brave_error(429, "RATE_LIMITED", "Request rate limit exceeded "
                             "for plan", {"plan": "Free", "rate_limit": 1, "rate_current": 1,
                             "quota_limit": 2000, "quota_current": 2000,
                             "component": "rate_limiter"}), _BRAVE_LIMITS),
        ("tavily", "auth"): (401, {"detail": {"error": "Unauthorized: missing or invalid API "
                             "key."}}, {}),
        ("tavily", "rate"): (429, {"detail": {"error": "Your request has been blocked due to "
                             "excessive requests."}}, {"retry-after": "2"}),
        ("tavily", "spent"): (432, {"detail": {"error": "This request exceeds your plan's set "
                              "usage limit."}}, {}),
        ("exa", "auth"): (401, {"requestId": "fake", "error": "Invalid API key"}, {}),
        ("exa", "rate"): (429, {"requestId": "fake", "error": "rate limit exceeded"}, {}),
        ("exa", "spent"): (402, {"requestId": "fake", "error": "You have run out of credits",
                           "tag": "NO_MORE_CREDITS"}, {}),
        ("serper", "auth"): (403, {"message": "Unauthorized.", "statusCode": 403}, {}),
        ("serper", "rate"): (429, {"message": "Too many requests", "statusCode": 429}, {}),
        ("serper", "spent"): (400, {"message": "Not enough credits", "statusCode": 400}, {}),
    }  # fmt: skip
    status, body, headers = table[(vendor, fault)]
    return JSONResponse(body, status_code=status, headers=headers)


def _key_of(vendor: Vendor, headers: dict[str, str]) -> str | None:
    if vendor == "brave":
        return headers.get("x-subscription-token")
    if vendor == "serper":
        return headers.get("x-api-key")
    if vendor == "exa" and "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


def _recency(vendor: Vendor, req: dict[str, Any]) -> int | str | None:
    """Days a request limits results to, None for none, or a string naming a bad value."""
    if vendor == "exa":
        return "exa" if req["body"].get("startPublishedDate") else None  # checked by date
    value = (
        req["params"].get("freshness")
        if vendor == "brave"
        else (req["body"].get("time_range") if vendor == "tavily" else req["body"].get("tbs"))
    )
    if value is None:
        return None
    return _DAYS.get(str(value), f"bad recency {value!r}")


def make_vendor_app(
    vendor: Vendor, docs: Sequence[SearchDoc], *, api_key: str = "test-key",
    latency_s: float = 0.0,
) -> Starlette:  # fmt: skip
    """A Starlette app answering `vendor`'s search endpoint over `docs`."""
    index, control = BM25Index(docs), VendorControl(latency_s=latency_s)

    async def search(request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return JSONResponse({"error": "invalid JSON body"}, status_code=400)
        req = {"headers": headers, "params": dict(request.query_params), "body": body}
        fault = control._record(req)
        if control.latency_s:
            await asyncio.sleep(control.latency_s)
        if fault is None and _key_of(vendor, headers) != api_key:
            fault = "auth"
        if fault is not None:
            return fault_response(vendor, fault)
        query = str(
            req["params"].get("q") if vendor == "brave" else body.get("query", body.get("q"))
        )
        if vendor == "brave" and not (1 <= int(req["params"].get("count", 20)) <= 20):
            return JSONResponse(
                _brave_error(422, "VALIDATION", "count out of range", {}), status_code=422
            )
        hits = index.search(query)
        days = _recency(vendor, req)
        if isinstance(days, str) and days != "exa":
            return JSONResponse({"error": days}, status_code=400)
        if isinstance(days, int):
            hits = [(d, s) for d, s in hits if _published_within(d, days)]
        if days == "exa":  # startPublishedDate drops undated pages
            since = str(body["startPublishedDate"])[:10]
            hits = [(d, s) for d, s in hits if d.published and d.published[:10] >= since]
        return JSONResponse(_ANSWERS[vendor](hits, req))

    method = "GET" if vendor == "brave" else "POST"
    app = Starlette(routes=[Route(PATHS[vendor], search, methods=[method])])
    app.state.control = control
    return app


def vendor_control(app: Starlette) -> VendorControl:
    """The counters and fault switch of an app made by `make_vendor_app`."""
    control = app.state.control
    if not isinstance(control, VendorControl):
        raise TypeError("not a vendor fake")
    return control
