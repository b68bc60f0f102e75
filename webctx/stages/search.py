"""Run queries against a SearchProvider and merge the answers into one ranked URL list."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from webctx.models import SearchResult, ascii_host, host_name
from webctx.protocols import SearchProvider

logger = logging.getLogger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}
_TRACKING_PARAMS = frozenset(
    {
        "gclid",
        "gclsrc",
        "dclid",
        "fbclid",
        "msclkid",
        "yclid",
        "twclid",
        "ttclid",
        "igshid",
        "mc_cid",
        "mc_eid",
        "_ga",
        "_gl",
        "_hsenc",
        "_hsmi",
        "mkt_tok",
        "oly_anon_id",
        "oly_enc_id",
        "vero_id",
        "wickedid",
        "srsltid",
    }
)


def _is_tracking(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith(("utm_", "pk_", "hsa_")) or lowered in _TRACKING_PARAMS


def normalize_url(url: str) -> str:
    """A canonical form for de-duplication: lower-case scheme and host, no default port,
    fragment, tracking parameters or trailing slash; remaining parameters sorted."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:  # an unparsable port or bracketed host: compare as given
        return url.strip()
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if not scheme or not host:
        return url.strip()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host if port is None or _DEFAULT_PORTS.get(scheme) == port else f"{host}:{port}"
    if parts.username is not None:
        netloc = f"{parts.netloc.rsplit('@', 1)[0]}@{netloc}"
    path = parts.path.rstrip("/") or "/"
    query = sorted(
        (k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not _is_tracking(k)
    )
    return urlunsplit((scheme, netloc, path, urlencode(query), ""))


def _clean_domain(domain: str) -> str:
    """A filter entry as requests hold it (`host_name`: "Example.com", "*.example.com" ->
    "example.com"); one that is no host name matches nothing."""
    try:
        return host_name(domain)
    except ValueError:
        return ""


def domain_matches(host: str, domains: Sequence[str]) -> bool:
    """True when `host` is one of `domains` or a subdomain of one (an internationalised
    host compared in its IDNA form, as filters hold it)."""
    host = host.lower().rstrip(".") if host.isascii() else ascii_host(host)
    return any(host == d or host.endswith("." + d) for d in domains if d)


@dataclass
class _Merged:
    result: SearchResult
    lists: set[int]
    first_seen: int


def merge_results(
    result_lists: Sequence[Sequence[SearchResult]],
    *,
    include_domains: Sequence[str] = (),
    exclude_domains: Sequence[str] = (),
) -> list[SearchResult]:
    """One result per normalised URL, keeping its best rank; ordered by best rank, then by
    how many lists found it. Domain filters match subdomains; excludes win."""
    include = [_clean_domain(d) for d in include_domains]
    exclude = [_clean_domain(d) for d in exclude_domains]
    merged: dict[str, _Merged] = {}
    for list_no, results in enumerate(result_lists):
        for result in results:
            host = urlsplit(result.url).hostname or ""
            if (include and not domain_matches(host, include)) or domain_matches(host, exclude):
                continue
            key = normalize_url(result.url)
            entry = merged.get(key)
            if entry is None:
                merged[key] = _Merged(result, {list_no}, len(merged))
                continue
            entry.lists.add(list_no)
            if result.rank < entry.result.rank:
                entry.result = result
    ordered = sorted(merged.values(), key=lambda m: (m.result.rank, -len(m.lists), m.first_seen))
    return [m.result for m in ordered]


def time_range(recency_days: int) -> str:
    """The coarsest provider time range that covers `recency_days`: day/week/month/year."""
    if recency_days <= 1:
        return "day"
    if recency_days <= 7:
        return "week"
    if recency_days <= 31:
        return "month"
    return "year"


def search_query(
    provider: SearchProvider, query: str, *, limit: int, recency_days: int | None = None
) -> list[SearchResult]:
    """Up to `limit` http(s) results of one query, tagged with the query and provider."""
    results = provider.search(query, limit=limit, recency_days=recency_days)
    tagged = [
        r.model_copy(update={"query": r.query or query, "provider": r.provider or provider.name})
        for r in results
        if r.url.lower().startswith(("http://", "https://"))
    ]
    logger.info(
        "search done",
        extra={"provider": provider.name, "query": query, "results": len(tagged)},
    )
    return tagged[:limit]
