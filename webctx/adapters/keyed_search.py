"""What the keyed search APIs (brave, tavily, exa, serper) share: one JSON request under
their key, and the vendors' answers mapped onto the webctx error tree.

- no answer (refused, timeout, a connection broken mid-answer) and 5xx: ProviderUnavailable;
- 429: RateLimited with the answer's `retry-after` (or Brave's `X-RateLimit-Reset`) and its
  `x-ratelimit-*` headers;
- a refused key: ProviderError naming the provider and the variables that set the key;
- spent credits or plan limits, other 4xx, a body that is no JSON object: ProviderError.

A chain (webctx/adapters/search_chain.py) hands a query on after any of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from webctx.adapters.searxng_search import parse_retry_after
from webctx.errors import ProviderError, ProviderUnavailable, RateLimited
from webctx.search_settings import DEFAULT_BASE_URLS, VENDOR_KEY_ENV

Json = dict[str, Any]
Refusal = Callable[[int, Json, httpx.Response], Exception | None]
"""A vendor's reading of one non-2xx answer: the error to raise, or None for the defaults."""
_TAGS = re.compile(r"<[^>]{1,40}>")


def key_variables(provider: str) -> str:
    """The variables a provider's key is read from, for messages."""
    return f"{VENDOR_KEY_ENV[provider]} or WEBCTX_{provider.upper()}__API_KEY"


def key_refused(provider: str, status: int, detail: str) -> ProviderError:
    """The error of an answer that refuses our key (missing, wrong, revoked)."""
    return ProviderError(provider, f"the API key was refused (HTTP {status}: {_short(detail)}); "
                         f"check {key_variables(provider)}")  # fmt: skip


def spent(provider: str, status: int, detail: str) -> ProviderError:
    """The error of an answer saying the key's credits or plan limit are spent."""
    return ProviderError(provider, f"the key's credits or plan limit are spent (HTTP {status}: "
                         f"{_short(detail)})")  # fmt: skip


def plain_text(value: object) -> str:
    """A string field without the HTML highlight tags some vendors put in snippets."""
    return " ".join(_TAGS.sub("", value).split()) if isinstance(value, str) else ""


def http_url(value: object) -> str | None:
    """`value` when it is an http(s) URL, else None."""
    return value if isinstance(value, str) and value.startswith(("http://", "https://")) else None


def listed(
    provider: str, items: object, *, url_field: str = "url", name: str = "results"
) -> list[tuple[str, Json]]:
    """Each result object of the vendor's list `items` that names an http(s) URL in
    `url_field`, with that URL, in order; an answer without the list is a ProviderError."""
    if not isinstance(items, list):
        raise ProviderError(provider, f"response has no {name} list")
    found: list[tuple[str, Json]] = []
    for item in items:
        url = http_url(item.get(url_field)) if isinstance(item, dict) else None
        if url is not None:
            found.append((url, item))
    return found


def text_or_none(value: object) -> str | None:
    """A page text a vendor sent, or None when it sent none (absent, empty, not a string)."""
    return value if isinstance(value, str) and value.strip() else None


class KeyedApi:
    """One vendor's HTTP endpoint under its key: `request` returns the answer's JSON object."""

    def __init__(
        self,
        provider: str,
        *,
        base_url: str | None,
        headers: Mapping[str, str],
        refusal: Refusal,
        client: httpx.Client | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.provider = provider
        self.base_url = (base_url or DEFAULT_BASE_URLS[provider]).rstrip("/")
        self._headers = {"Accept": "application/json", **headers}
        self._refusal, self._timeout_s = refusal, timeout_s
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout_s)

    def request(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None,
        body: Json | None = None,
    ) -> Json:  # fmt: skip
        """The JSON object of a 2xx answer; raises the webctx error tree."""
        try:
            resp = self._client.request(method, f"{self.base_url}{path}", params=params,
                                        json=body, headers=self._headers,
                                        timeout=self._timeout_s)  # fmt: skip
        except httpx.UnsupportedProtocol as exc:
            raise ProviderError(self.provider, f"bad base URL: {exc}") from exc
        except httpx.TransportError as exc:
            raise _unavailable(self.provider, exc) from exc
        if resp.status_code >= 300:
            raise self._error(resp)
        try:
            answer = resp.json()
        except ValueError as exc:
            raise ProviderError(self.provider, "response is not JSON") from exc
        if not isinstance(answer, dict):
            raise ProviderError(self.provider, "response is not a JSON object")
        return answer

    def close(self) -> None:
        """Close the HTTP client if this adapter created it."""
        if self._owns_client:
            self._client.close()

    def _error(self, resp: httpx.Response) -> Exception:
        status = resp.status_code
        try:
            parsed = resp.json()
        except ValueError:
            parsed = None
        body: Json = parsed if isinstance(parsed, dict) else {}
        vendor = self._refusal(status, body, resp)
        if vendor is not None:
            return vendor
        if status == 429:
            return rate_limited(self.provider, resp)
        if status >= 500:
            return ProviderUnavailable(f"{self.provider}: HTTP {status}", kind="status",
                                       detail=f"HTTP {status}")  # fmt: skip
        detail = error_detail(body) or resp.text
        return ProviderError(self.provider, f"HTTP {status}: {_short(detail)}")


def rate_limited(
    provider: str, resp: httpx.Response, *, retry_after: float | None = None
) -> RateLimited:
    """The RateLimited of a 429, with its wait and its `x-ratelimit-*` headers."""
    limits = {k.lower(): v for k, v in resp.headers.items() if k.lower().startswith("x-ratelimit")}
    wait = retry_after if retry_after is not None else parse_retry_after(
        resp.headers.get("retry-after"))  # fmt: skip
    return RateLimited(f"{provider}: 429", retry_after=wait, rate_limits=limits)


def error_detail(body: Json) -> str:
    """The message of a vendor's error body: `detail.error` (Tavily), `error` (Exa, Brave's
    `error.detail`), `message` (Serper)."""
    for value in (body.get("detail"), body.get("error"), body.get("message")):
        if isinstance(value, dict):
            inner = value.get("error") or value.get("detail") or value.get("code")
            if isinstance(inner, str):
                return inner
        elif isinstance(value, str):
            return value
    return ""


def _unavailable(provider: str, exc: httpx.TransportError) -> ProviderUnavailable:
    if isinstance(exc, httpx.TimeoutException):
        kind = "timeout"
    elif isinstance(exc, httpx.ConnectError):
        kind = "unreachable"
    else:
        kind = "error"
    detail = str(exc) or type(exc).__name__
    return ProviderUnavailable(f"{provider}: {type(exc).__name__}: {exc}", kind=kind,
                               detail=detail)  # fmt: skip


def _short(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= 120 else line[:119] + "…"
