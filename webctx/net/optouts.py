"""Publishers' opt-outs beyond robots.txt, read from a page's answer: which rule, if any,
reserves the page from text and data mining, and which keeps it out of an index.

Read here:
- `X-Robots-Tag` response headers (Google's syntax): comma-separated directives, each
  header on its own; `name: directives` scopes what follows to one crawler (`webctx:
  noai`), and only our product token's scope and unscoped directives apply.
- `<meta name="robots">` and `<meta name="<product token>">` (same directives).
- The W3C TDM Reservation Protocol (TDMRep): the `tdm-reservation: 1` header, `<meta
  name="tdm-reservation" content="1">`, and the origin's `/.well-known/tdmrep.json`, an
  array of `{"location": pattern, "tdm-reservation": 0|1, "tdm-policy": url}` whose
  first rule matching the path applies (patterns as robots.txt's: `*`, final `$`).

What they mean here: `noai` and `none` (and a TDM reservation anywhere of the three
places: the most restrictive reading wins) reserve the page; `noindex` (and `none`)
keeps it out of the persistent index; `noimageai` concerns images, which webctx never
keeps. Other directives (`nofollow`, `nosnippet`, ...) do not change what webctx does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from webctx.models import Download
from webctx.net.robots import match_pattern, normalise, path_pattern, request_path

TDMREP_PATH = "/.well-known/tdmrep.json"
TDMREP_MAX_BYTES = 512 * 1024
KEPT_HEADERS = ("x-robots-tag", "tdm-reservation", "tdm-policy")
"""The response headers a Download keeps (lower case), for the opt-outs read here."""
_META_SCAN_BYTES = 512 * 1024  # robots meta tags sit in the head; a page's first 512 KiB
_META = re.compile(r"<meta\b[^>]*>", re.I)
_ATTR = re.compile(r"""([A-Za-z_:][-\w:.]*)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>`]+))""")
_SCOPE = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*:\s*(.*)$", re.S)
# Directives that carry a value after a colon: not a crawler's name.
_VALUED = frozenset({"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"})
_RESERVING = frozenset({"noai", "none"})
_NOINDEX = frozenset({"noindex", "none"})
_HTML = ("text/html", "application/xhtml+xml")


@dataclass(frozen=True)
class OptOuts:
    """A page's opt-outs: the rule that reserves it (None: not reserved) and the rule that
    keeps it out of an index (None: indexable)."""

    reserved: str | None = None
    noindex: str | None = None


def robots_directives(values: Iterable[str], token: str) -> list[tuple[str, str | None]]:
    """(directive, scope) of X-Robots-Tag values that apply to `token`, lower case, in
    order; scope None for unscoped directives."""
    token = token.lower()
    found: list[tuple[str, str | None]] = []
    for value in values:
        scope: str | None = None  # a scope lasts to the end of its header
        for part in value.split(","):
            scoped = _SCOPE.match(part)
            if scoped and scoped.group(1).lower() not in _VALUED:
                scope, part = scoped.group(1).lower(), scoped.group(2)
            directive = part.strip().lower()
            if directive and (scope is None or scope == token):
                found.append((directive, scope))
    return found


def header_opt_outs(headers: Sequence[tuple[str, str]], token: str) -> OptOuts:
    """What the response headers say (X-Robots-Tag, tdm-reservation)."""
    tags = [value for name, value in headers if name.lower() == "x-robots-tag"]
    reserved, noindex = _robots_verdict(robots_directives(tags, token), "X-Robots-Tag")
    if reserved is None:
        reserved = _tdm_verdict(headers, "")
    return OptOuts(reserved, noindex)


def meta_opt_outs(body: bytes, token: str) -> OptOuts:
    """What `<meta name="robots">`, `<meta name="<token>">` and `<meta
    name="tdm-reservation">` in an HTML body say."""
    text = body[:_META_SCAN_BYTES].decode("latin-1")  # tags are ASCII; values compared so
    tags: list[tuple[str, str]] = []
    for tag in _META.finditer(text):
        attrs = {m.group(1).lower(): _value(m) for m in _ATTR.finditer(tag.group(0)[5:])}
        name, content = attrs.get("name", "").strip().lower(), attrs.get("content", "")
        if name:
            tags.append((name, content))
    token = token.lower()
    reserved = noindex = None
    for name, content in tags:
        if name not in ("robots", token):
            continue
        found = [(d.strip().lower(), None) for d in content.split(",") if d.strip()]
        got = _robots_verdict(found, f'meta name="{name}"')
        reserved, noindex = reserved or got[0], noindex or got[1]
    if reserved is None:
        reserved = _tdm_verdict(tags, "meta name=")
    return OptOuts(reserved, noindex)


def page_opt_outs(download: Download, token: str) -> OptOuts:
    """Every opt-out of a download: headers, meta tags (HTML), its origin's tdmrep.json
    rule (`download.tdmrep_rule`, found by the fetcher). The first reserving rule of
    headers, tdmrep.json, meta (in that order) is named."""
    heads = header_opt_outs(download.headers, token)
    media = download.content_type.split(";")[0].strip().lower()
    meta = meta_opt_outs(download.body, token) if media in _HTML else OptOuts()
    reserved = heads.reserved or download.tdmrep_rule or meta.reserved
    return OptOuts(reserved, heads.noindex or meta.noindex)


def _robots_verdict(
    found: Sequence[tuple[str, str | None]], where: str
) -> tuple[str | None, str | None]:
    """(reserving rule, noindex rule) among robots directives, as rule texts."""
    reserved = noindex = None
    for directive, scope in found:
        rule = f"{where}: {scope + ': ' if scope else ''}{directive}"
        if directive in _RESERVING and reserved is None:
            reserved = rule
        if directive in _NOINDEX and noindex is None:
            noindex = rule
    return reserved, noindex


def _tdm_verdict(pairs: Sequence[tuple[str, str]], prefix: str) -> str | None:
    """`tdm-reservation: 1` among header or meta (name, value) pairs, with its policy."""
    values = {name.lower(): value.strip() for name, value in pairs}
    if values.get("tdm-reservation") != "1":
        return None
    policy = values.get("tdm-policy")
    quoted = '"tdm-reservation"' if prefix else "tdm-reservation"
    rule = f"{prefix}{quoted}: 1"
    return f"{rule} (policy {policy})" if policy else rule


def _value(match: re.Match[str]) -> str:
    return next((g for g in match.groups()[1:] if g is not None), "")


@dataclass(frozen=True)
class TdmRule:
    """One entry of a tdmrep.json: its location pattern (normalised) and verdict."""

    location: str
    pattern: str
    reserved: bool
    policy: str | None = None

    def text(self) -> str:
        """The rule as a failure record names it."""
        rule = f"tdmrep.json: {self.location} tdm-reservation={int(self.reserved)}"
        return f"{rule} (policy {self.policy})" if self.policy else rule


@dataclass(frozen=True)
class TdmRep:
    """An origin's tdmrep.json rules, in file order (empty: nothing reserved)."""

    rules: tuple[TdmRule, ...] = ()

    def decide(self, url: str) -> str | None:
        """The rule reserving `url` (path and query), or None; the first match decides."""
        target = normalise(request_path(url))
        for rule in self.rules:
            if match_pattern(rule.pattern, target):
                return rule.text() if rule.reserved else None
        return None


def tdmrep_rules(status: int, body: bytes) -> TdmRep:
    """The rules of a GET /.well-known/tdmrep.json answer (after redirects). Anything but
    a 2xx JSON array of rules (a 404, a broken file) reserves nothing: a bad entry is
    skipped, the others kept."""
    if not 200 <= status < 300 or len(body) > TDMREP_MAX_BYTES:
        return TdmRep()
    try:
        entries = json.loads(body.decode("utf-8-sig", errors="replace"))
    except ValueError:
        return TdmRep()
    if not isinstance(entries, list):
        return TdmRep()
    rules = []
    for entry in entries:
        rule = _tdm_rule(entry)
        if rule is not None:
            rules.append(rule)
    return TdmRep(tuple(rules))


def _tdm_rule(entry: object) -> TdmRule | None:
    if not isinstance(entry, dict):
        return None
    location, reservation = entry.get("location"), entry.get("tdm-reservation")
    if not isinstance(location, str) or not location.strip() or str(reservation) not in ("0", "1"):
        return None
    policy = entry.get("tdm-policy")
    location = location.strip()[:200]
    return TdmRule(location, path_pattern(location), str(reservation) == "1",
                   policy if isinstance(policy, str) and policy else None)  # fmt: skip
