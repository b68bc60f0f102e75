"""An OpenAI-compatible `POST /v1/embeddings` endpoint with real rate limits.

It answers like api.openai.com does: the same body, `encoding_format=base64`
(the official client's default), `dimensions`, 400s in OpenAI's error shape, and
429s with `retry-after` plus the `x-ratelimit-*` headers on every response. Request
and token limits are enforced over a sliding window of `window_s` seconds.
"""

from __future__ import annotations

import asyncio
import base64
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from webctx.devweb.server import InFlight
from webctx.tokens import count_tokens, decode

EmbedFn = Callable[[list[str]], list[list[float]]]


def format_duration(seconds: float) -> str:
    """A duration as OpenAI writes it in `x-ratelimit-reset-*`: "17ms", "1s", "6m0s"."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if minutes or hours:
        text = f"{minutes}m{text}"
    return f"{hours}h{text}" if hours else text


@dataclass
class EmbeddingsStats:
    """What the endpoint has seen; `tokens` and `inputs` count accepted requests only."""

    requests: int = 0
    accepted: int = 0
    rejected_429: int = 0
    rejected_400: int = 0
    injected: int = 0
    tokens: int = 0
    inputs: int = 0


class SlidingWindow:
    """Requests and tokens admitted within the last `window_s` seconds."""

    def __init__(self, *, rpm: int | None, tpm: int | None, window_s: float) -> None:
        self.rpm, self.tpm, self.window_s = rpm, tpm, window_s
        self._events: deque[tuple[float, int]] = deque()

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] + self.window_s <= now:
            self._events.popleft()

    def admit(self, tokens: int, now: float) -> float | None:
        """Record the request and return None, or return the seconds to wait before retrying."""
        self._expire(now)
        waits = [0.0]
        if self.rpm is not None and len(self._events) >= self.rpm:
            waits.append(self._events[len(self._events) - self.rpm][0] + self.window_s - now)
        if self.tpm is not None:
            excess = sum(t for _, t in self._events) + tokens - self.tpm
            if tokens > self.tpm:
                waits.append(self.window_s)  # never fits; OpenAI also answers 429 here
            elif excess > 0:
                for at, spent in self._events:
                    excess -= spent
                    if excess <= 0:
                        waits.append(at + self.window_s - now)
                        break
        wait = max(waits)
        if wait > 0:
            return wait
        self._events.append((now, tokens))
        return None

    def headers(self, now: float) -> dict[str, str]:
        """The `x-ratelimit-*` headers describing the window at `now`."""
        self._expire(now)
        reset = (self._events[-1][0] + self.window_s - now) if self._events else 0.0
        out: dict[str, str] = {}
        if self.rpm is not None:
            out["x-ratelimit-limit-requests"] = str(self.rpm)
            out["x-ratelimit-remaining-requests"] = str(max(0, self.rpm - len(self._events)))
            out["x-ratelimit-reset-requests"] = format_duration(reset)
        if self.tpm is not None:
            used = sum(t for _, t in self._events)
            out["x-ratelimit-limit-tokens"] = str(self.tpm)
            out["x-ratelimit-remaining-tokens"] = str(max(0, self.tpm - used))
            out["x-ratelimit-reset-tokens"] = format_duration(reset)
        return out


@dataclass
class EmbeddingsControl:
    """Limits, counters and fault injection of one dev embeddings app (thread-safe)."""

    window: SlidingWindow
    stats: EmbeddingsStats = field(default_factory=EmbeddingsStats)
    in_flight: InFlight = field(default_factory=InFlight)
    """Accepted requests being answered at once."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _faults: list[tuple[int, float]] = field(default_factory=list)
    _always: tuple[int, float] | None = None

    def fail_next(self, n: int = 1, *, status: int = 500, retry_after: float = 1.0) -> None:
        """Answer the next `n` requests with `status` (500 or 429, with `retry_after` seconds)."""
        with self.lock:
            self._faults.extend([(status, retry_after)] * n)

    def fail_always(self, *, status: int = 500, retry_after: float = 1.0) -> None:
        """Answer every request with `status` until `recover()`: a provider that is down
        (500 forever) or whose key is spent (429 forever, `retry-after` each time)."""
        with self.lock:
            self._always = (status, retry_after)

    def recover(self) -> None:
        """Drop every injected fault: answer normally again."""
        with self.lock:
            self._faults.clear()
            self._always = None

    def pop_fault(self) -> tuple[int, float] | None:
        """Count a request and return the status of a pending injected fault, if any."""
        with self.lock:
            self.stats.requests += 1
            if not self._faults and self._always is None:
                return None
            self.stats.injected += 1
            return self._faults.pop(0) if self._faults else self._always


class BadRequest(Exception):
    """A request the endpoint refuses with 400 (or `status`)."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


@dataclass(frozen=True)
class EmbeddingsLimits:
    """Per-request caps of the endpoint (OpenAI's defaults)."""

    max_inputs: int = 2048
    max_tokens_per_request: int = 300_000
    max_input_tokens: int = 8192


@dataclass(frozen=True)
class EmbeddingsRequest:
    """A validated embeddings request."""

    texts: list[str]
    tokens: int
    encoding_format: str
    dimensions: int | None


def _error_body(
    message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _texts(raw: object) -> list[str]:
    """The `input` field as strings; token arrays are decoded, as OpenAI accepts them."""
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'$.input' is invalid. Please check the API reference.", param="input")
    texts: list[str] = []
    for item in raw:
        if isinstance(item, list) and item and all(isinstance(t, int) for t in item):
            try:
                texts.append(decode(item))
            except ValueError as exc:  # unknown token id, or ids that split a character
                raise BadRequest("'$.input' has invalid token ids.", param="input") from exc
        elif isinstance(item, str) and item:
            texts.append(item)
        else:
            raise BadRequest("'$.input' is invalid. Please check the API reference.", param="input")
    return texts


def _dimensions(raw: object) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise BadRequest("Invalid value for 'dimensions'.", param="dimensions")
    return raw


def parse_request(body: object, model: str, limits: EmbeddingsLimits) -> EmbeddingsRequest:
    """Validate a request body the way OpenAI does, counting tokens with cl100k_base."""
    if not isinstance(body, dict):
        raise BadRequest("We could not parse the JSON body of your request.")
    if not body.get("model"):
        raise BadRequest("you must provide a model parameter", param="model")
    if body["model"] != model:
        raise BadRequest(
            f"The model `{body['model']}` does not exist or you do not have access to it.",
            code="model_not_found",
            status=404,
        )
    texts = _texts(body.get("input"))
    if len(texts) > limits.max_inputs:
        raise BadRequest(
            f"Too many inputs. The max number of inputs is {limits.max_inputs}.", param="input"
        )
    counts = [count_tokens(t) for t in texts]
    if max(counts) > limits.max_input_tokens:
        raise BadRequest(
            f"This model's maximum context length is {limits.max_input_tokens} tokens, "
            f"however you requested {max(counts)} tokens.",
            param="input",
        )
    if sum(counts) > limits.max_tokens_per_request:
        raise BadRequest(
            f"Requested {sum(counts)} tokens, "
            f"max {limits.max_tokens_per_request} tokens per request",
            param="input",
            code="max_tokens_per_request",
        )
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise BadRequest("Invalid value for 'encoding_format'.", param="encoding_format")
    return EmbeddingsRequest(texts, sum(counts), str(fmt), _dimensions(body.get("dimensions")))


def _shape(vectors: Sequence[Sequence[float]], req: EmbeddingsRequest) -> list[list[float] | str]:
    """Apply `dimensions` (truncate, re-normalise) and `encoding_format` to each vector."""
    arr = np.asarray(vectors, dtype=np.float64)
    if req.dimensions is not None:
        if req.dimensions > arr.shape[1]:
            raise BadRequest(
                f"This model does not support {req.dimensions} dimensions; "
                f"the maximum is {arr.shape[1]}.",
                param="dimensions",
            )
        arr = arr[:, : req.dimensions]
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        arr = arr / np.where(norms == 0, 1.0, norms)
    if req.encoding_format == "base64":
        # What the openai client decodes: little-endian float32, base64.
        return [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in arr]
    return [row.tolist() for row in arr]


_INJECTED = {
    429: ("Rate limit reached (injected fault).", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request.", "server_error", None),
}


class _Endpoint:
    """The request handlers; state lives in `control`."""

    def __init__(
        self,
        embed_fn: EmbedFn,
        model: str,
        limits: EmbeddingsLimits,
        control: EmbeddingsControl,
        latency_s: float,
        api_key: str | None = None,
    ) -> None:
        self.embed_fn, self.model, self.limits = embed_fn, model, limits
        self.control, self.latency_s = control, latency_s
        self.api_key = api_key

    def reply(
        self, status: int, body: dict[str, Any], retry_after: float | None = None
    ) -> Response:
        with self.control.lock:
            headers = self.control.window.headers(time.monotonic())
        headers["x-request-id"] = f"req_{uuid.uuid4().hex}"
        if retry_after is not None:
            headers["retry-after"] = str(max(1, math.ceil(retry_after)))
            # Integer seconds are too coarse for short test windows; Azure sends this too.
            headers["retry-after-ms"] = str(max(1, math.ceil(retry_after * 1000)))
        return JSONResponse(body, status_code=status, headers=headers)

    def refuse(self, exc: Exception) -> Response:
        with self.control.lock:
            self.control.stats.rejected_400 += 1
        if not isinstance(exc, BadRequest):  # invalid JSON
            exc = BadRequest("We could not parse the JSON body of your request.")
        body = _error_body(str(exc), type_="invalid_request_error", param=exc.param, code=exc.code)
        return self.reply(exc.status, body)

    def admit(self, req: EmbeddingsRequest) -> Response | None:
        """None when the window admits the request, else the 429 to send."""
        control = self.control
        with control.lock:
            wait = control.window.admit(req.tokens, time.monotonic())
            if wait is not None:
                control.stats.rejected_429 += 1
            else:
                control.stats.accepted += 1
                control.stats.tokens += req.tokens
                control.stats.inputs += len(req.texts)
        if wait is None:
            return None
        message = (
            f"Rate limit reached for {self.model}: limit rpm={control.window.rpm}, "
            f"tpm={control.window.tpm}; requested {req.tokens} tokens. "
            f"Please try again in {wait:.3f}s."
        )
        body = _error_body(message, type_="requests", code="rate_limit_exceeded")
        return self.reply(429, body, retry_after=wait)

    async def embeddings(self, request: Request) -> Response:
        if self.api_key is not None and request.headers.get("authorization") != (
            f"Bearer {self.api_key}"
        ):
            body = _error_body("Incorrect API key provided.", type_="invalid_request_error",
                               code="invalid_api_key")  # fmt: skip
            return self.reply(401, body)
        fault = self.control.pop_fault()
        if fault is not None:
            status, retry_after = fault
            message, type_, code = _INJECTED.get(status, _INJECTED[500])
            body = _error_body(message, type_=type_, code=code)
            return self.reply(status, body, retry_after if status == 429 else None)
        try:
            raw = await request.json()
            req = await run_in_threadpool(parse_request, raw, self.model, self.limits)
        except (BadRequest, ValueError) as exc:
            return self.refuse(exc)
        limited = self.admit(req)
        if limited is not None:
            return limited
        with self.control.in_flight.answering():
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            vectors = await run_in_threadpool(self.embed_fn, req.texts)
        try:
            data = _shape(vectors, req)
        except BadRequest as exc:
            return self.refuse(exc)
        rows = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(data)]
        usage = {"prompt_tokens": req.tokens, "total_tokens": req.tokens}
        return self.reply(
            200, {"object": "list", "data": rows, "model": self.model, "usage": usage}
        )

    async def models(self, _: Request) -> Response:
        entry = {"id": self.model, "object": "model", "created": 0, "owned_by": "webctx-devweb"}
        return JSONResponse({"object": "list", "data": [entry]})


def make_embeddings_app(
    embed_fn: EmbedFn,
    *,
    model: str,
    rpm: int | None,
    tpm: int | None,
    max_inputs: int = 2048,
    max_tokens_per_request: int = 300_000,
    max_input_tokens: int = 8192,
    latency_s: float = 0.0,
    window_s: float = 60.0,
    api_key: str | None = None,
) -> Starlette:
    """A Starlette app serving `POST /v1/embeddings` and `GET /v1/models` for `model`;
    with `api_key`, embeddings requests without `Authorization: Bearer <api_key>` get 401."""
    control = EmbeddingsControl(SlidingWindow(rpm=rpm, tpm=tpm, window_s=window_s))
    limits = EmbeddingsLimits(max_inputs, max_tokens_per_request, max_input_tokens)
    endpoint = _Endpoint(embed_fn, model, limits, control, latency_s, api_key)
    app = Starlette(
        routes=[
            Route("/v1/embeddings", endpoint.embeddings, methods=["POST"]),
            Route("/v1/models", endpoint.models, methods=["GET"]),
        ]
    )
    app.state.control = control
    return app


def embeddings_control(app: Starlette) -> EmbeddingsControl:
    """The limits, counters and fault switch of an app made by `make_embeddings_app`."""
    control = app.state.control
    if not isinstance(control, EmbeddingsControl):
        raise TypeError("not a dev embeddings app")
    return control
