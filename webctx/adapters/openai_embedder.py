"""Embedder on any OpenAI-compatible `/embeddings` endpoint, via the official client.

The client's own retries are off (`max_retries=0`): retries, backoff and rate limiting
belong to `webctx.stages.embed` and the worker layer, which see every 429.

Requests go through the client's documented `post(path, cast_to=httpx.Response)`: its base
URL, auth, timeouts, connection pool and error classes, without its typed request and
response models. Building those walked every input and every vector and cost more CPU
than the rest of the request (3.5-5 ms instead of 9-12 ms per 64-input request on this
project's 2-core machine); the body asked for and decoded is what `embeddings.create`
asks for and decodes: base64 float32, or floats from a server that ignores the format.
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx
import numpy as np

from webctx.errors import ProviderError, ProviderUnavailable, RateLimited
from webctx.net.ratelimit import rate_limit_headers, retry_after_s
from webctx.protocols import Embeddings

if TYPE_CHECKING:
    import openai

PROVIDER = "openai"
# Local OpenAI-compatible servers ignore the key, but the client refuses to start without one.
_PLACEHOLDER_KEY = "unused"
# Statuses the openai client itself would retry: a lock timeout or a request timeout.
_TRANSIENT_4XX = {408, 409}


class OpenAIEmbedder:
    """One `embeddings.create` request per `embed()` call; errors mapped onto webctx's tree.

    The client (and the `openai` package, ~0.5 s of CPU to import) is built at the first
    request, or by `warm()`: a worker building its collaborators at start then consumes
    tasks that long sooner (its plan and search tasks need no embedder), and a process
    that never embeds never loads it."""

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        model: str,
        dimensions: int | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.model = model
        self.dimensions = dimensions
        self._options = {"base_url": base_url, "api_key": api_key or _PLACEHOLDER_KEY,
                         "timeout": timeout_s, "max_retries": 0}  # fmt: skip
        self._made: openai.OpenAI | None = None
        self._lock = threading.Lock()

    @property
    def _client(self) -> openai.OpenAI:
        """The client, built on first use (thread-safe)."""
        with self._lock:
            if self._made is None:
                import openai  # here, not at the top: processes never embedding skip it

                self._made = openai.OpenAI(**self._options)  # type: ignore[arg-type]
            return self._made

    def warm(self) -> None:
        """Build the client now (a worker's background thread, ahead of its first embed)."""
        _ = self._client

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """One vector per text, same order, with the answer's rate-limit headers. Raises
        RateLimited (with the 429's headers), ProviderUnavailable, ProviderError."""
        if not texts:
            return Embeddings([])
        client = self._client
        import openai  # loaded by `_client`

        body: dict[str, object] = {
            "model": self.model,
            "input": list(texts),
            "encoding_format": "base64",
        }
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        try:
            response = client.post(
                "/embeddings",
                cast_to=httpx.Response,
                body=body,
                options={"security": {"bearer_auth": True}},
            )
        except openai.APIStatusError as exc:
            raise _translate_status(exc) from exc
        except openai.APIConnectionError as exc:  # includes APITimeoutError
            kind = "timeout" if isinstance(exc, openai.APITimeoutError) else "unreachable"
            detail = str(exc.__cause__ or exc)  # the transport's words: "Connection refused"
            raise ProviderUnavailable(f"{PROVIDER}: {type(exc).__name__}: {exc}", kind=kind,
                                      detail=detail) from exc  # fmt: skip
        return Embeddings(_vectors(response, len(texts)), rate_limit_headers(response.headers))

    def close(self) -> None:
        """Close the underlying HTTP client, if it was built."""
        with self._lock:
            made, self._made = self._made, None
        if made is not None:
            made.close()


def _vectors(response: httpx.Response, count: int) -> list[list[float]]:
    """The `count` vectors of an embeddings answer in input order, or ProviderError."""
    try:
        rows = response.json()["data"]
        by_index = {int(row["index"]): row["embedding"] for row in rows}
        ordered = [by_index[i] for i in range(count)]
        if len(rows) != count:
            raise ValueError("extra rows")
        vectors = [_decode(raw) for raw in ordered]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ProviderError(PROVIDER, f"invalid response for {count} inputs: {exc!r}") from exc
    if len({len(v) for v in vectors}) > 1:
        raise ProviderError(PROVIDER, "invalid response: vectors of different dimensions")
    return vectors


def _decode(raw: object) -> list[float]:
    """One embedding: base64 little-endian float32, or a list of numbers."""
    if isinstance(raw, str):
        data = base64.b64decode(raw, validate=True)
        if not data or len(data) % 4:
            raise ValueError("base64 embedding is not whole float32s")
        floats: list[float] = np.frombuffer(data, dtype="<f4").tolist()
        return floats
    if (
        isinstance(raw, list)
        and raw
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in raw)
    ):
        return [float(x) for x in raw]
    raise ValueError(f"embedding is neither base64 nor a list of numbers: {str(raw)[:40]}")


def _translate_status(exc: openai.APIStatusError) -> Exception:
    """The webctx error for an HTTP error answer."""
    status = exc.status_code
    if status == 429 and exc.code == "insufficient_quota":
        # Billing, not pacing: retrying cannot help.
        return ProviderError(PROVIDER, f"429 insufficient_quota: {exc.message}")
    if status == 429:
        headers = exc.response.headers
        return RateLimited(f"{PROVIDER}: 429: {exc.message}", retry_after=retry_after_s(headers),
                           rate_limits=rate_limit_headers(headers))  # fmt: skip
    if status >= 500 or status in _TRANSIENT_4XX:
        return ProviderUnavailable(f"{PROVIDER}: HTTP {status}: {exc.message}", kind="status",
                                   detail=f"HTTP {status}")  # fmt: skip
    return ProviderError(PROVIDER, f"HTTP {status}: {exc.message}")
