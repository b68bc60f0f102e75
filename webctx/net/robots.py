"""robots.txt as RFC 9309 reads it: `parse_robots` turns a file into groups of rules,
`RobotsFile.decide` says whether a path may be fetched and which line said so.

Why not `urllib.robotparser`: it reads `*` and `$` as plain characters, applies the first
matching line instead of the longest, keeps only the first group naming an agent and
matches agent names as substrings (a group for `web` would bind `webctx`).

The rules, each from RFC 9309 (section numbers in brackets):
- Groups [2.1]: consecutive user-agent lines share a group; blank lines end nothing; any
  rule (or other group line) followed by a user-agent line starts a new group. Several
  groups naming one agent are merged [2.2.1]. Sitemap and Host lines belong to no group.
- Agents [2.2.1]: a group line's product token is its leading run of letters, `_` and
  `-`, compared case-insensitively and whole with ours. The `*` group applies only when
  no group names our token.
- Rules [2.2.2]: the longest matching pattern decides; between an Allow and a Disallow
  of equal length, Allow wins; no match allows. `*` matches any run of characters, a `$`
  at the pattern's end anchors it. Paths and patterns are compared after normalising
  percent-encoding: an escaped unreserved octet is decoded (`%62` is `b`), an escaped
  reserved one stays escaped (`%2F` is not `/`), everything else outside ASCII's printable
  range is escaped, hex in upper case.
- `/robots.txt` itself is always allowed [2.2.2]; at most `MAX_PARSE_BYTES` are read, a
  byte-order mark is skipped [2.5].
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_PARSE_BYTES = 500 * 1024  # RFC 9309 2.5: parse at least 500 KiB
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_RESERVED = frozenset(b":/?#[]@!$&'()*+,;=")
_SPECIAL = frozenset(b"*$")  # wildcard and end anchor in patterns
_HEX = frozenset(b"0123456789abcdefABCDEF")
_TOKEN = re.compile(r"[A-Za-z_-]+")
# Keys as sites write them, typos included (what Google's reference parser accepts).
_KEYS = {
    "user-agent": "user-agent", "useragent": "user-agent", "user agent": "user-agent",
    "allow": "allow", "disallow": "disallow", "dissallow": "disallow",
    "dissalow": "disallow", "disalow": "disallow", "diasllow": "disallow",
    "disallaw": "disallow", "crawl-delay": "crawl-delay", "crawl delay": "crawl-delay",
    "sitemap": "sitemap", "site-map": "sitemap", "host": "host",
}  # fmt: skip
_KEYS_LONGEST_FIRST = sorted(_KEYS, key=len, reverse=True)
_GLOBAL_KEYS = frozenset({"sitemap", "host"})  # belong to no group, split nothing


@dataclass(frozen=True)
class Rule:
    """One Allow or Disallow line: its normalised pattern and where it stood."""

    allow: bool
    pattern: str
    line: int
    text: str

    def matches(self, path: str) -> bool:
        """True if the (normalised) `path` matches this rule's pattern."""
        return match_pattern(self.pattern, path)


@dataclass(frozen=True)
class Decision:
    """A verdict for one path: allowed or not, and the rule (with its line) that decided;
    rule None when no rule matched or the path is /robots.txt."""

    allowed: bool
    rule: str | None = None
    line: int | None = None

    def reason(self) -> str:
        """Why, in words a failure record can carry."""
        verdict = "allowed" if self.allowed else "disallowed"
        if self.rule is None:
            return f"{verdict} by robots.txt (no rule matched)"
        where = f" line {self.line}" if self.line is not None else ""
        return f"{verdict} by robots.txt{where}: {self.rule}"


@dataclass
class Group:
    """The rules and Crawl-delay of every group naming one agent, merged."""

    rules: list[Rule] = field(default_factory=list)
    crawl_delay: float | None = None


@dataclass(frozen=True)
class RobotsFile:
    """A parsed robots.txt: merged groups by lower-cased product token ("*" for all)."""

    groups: dict[str, Group]

    def group_for(self, agent: str) -> Group | None:
        """The group our product token falls under: its own, else "*", else None."""
        own = self.groups.get(product_token(agent) or "*")
        return own if own is not None else self.groups.get("*")

    def decide(self, path: str, agent: str) -> Decision:
        """May `agent` (a product token or a User-Agent header) fetch `path`?

        `path` is the URL's path plus `?query` (a full URL is accepted too)."""
        target = normalise(request_path(path))
        if target == "/robots.txt":
            return Decision(True)
        group = self.group_for(agent)
        best: Rule | None = None
        for rule in group.rules if group is not None else ():
            if best is not None and len(rule.pattern) < len(best.pattern):
                continue
            if not rule.matches(target):
                continue
            if best is None or len(rule.pattern) > len(best.pattern) or rule.allow:
                best = rule
        if best is None:
            return Decision(True)
        return Decision(best.allow, best.text, best.line)

    def crawl_delay(self, agent: str) -> float | None:
        """The Crawl-delay of the group `agent` falls under, if it sets one."""
        group = self.group_for(agent)
        return group.crawl_delay if group is not None else None


def product_token(agent: str) -> str:
    """The product token of a User-Agent (`webctx/0.1 (+url)` -> `webctx`), lower case;
    "" if it does not start with one."""
    found = _TOKEN.match(agent.strip())
    return found.group(0).lower() if found else ""


def request_path(url: str) -> str:
    """The part of `url` robots.txt rules see: path (at least "/") and `?query`."""
    if not url.startswith(("http://", "https://", "//")):
        url = url.split("#", 1)[0]
        return url if url.startswith("/") else "/" + url
    parts = urllib.parse.urlsplit(url)
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query or url.endswith("?") else path


def normalise(text: str, *, pattern: bool = False) -> str:
    """`text` with percent-encoding in one canonical form (RFC 9309 2.2.2, module doc).

    In a path `*` and `$` are plain characters, escaped so that a pattern's `%2A` and
    `%24` (a literal `*` and `$`, RFC 9309 2.2.3) match them; in a pattern they stay
    special."""
    keep = _RESERVED if pattern else _RESERVED - _SPECIAL
    raw = text.encode("utf-8", errors="surrogateescape")
    out: list[str] = []
    i = 0
    while i < len(raw):
        byte = raw[i]
        if byte == 0x25 and i + 2 < len(raw) and raw[i + 1] in _HEX and raw[i + 2] in _HEX:
            byte = int(raw[i + 1 : i + 3], 16)
            i += 3
            out.append(f"%{byte:02X}" if byte in _RESERVED else _canonical(byte, keep))
            continue
        out.append(_canonical(byte, keep))
        i += 1
    return "".join(out)


def _canonical(byte: int, keep: frozenset[int]) -> str:
    if byte in _UNRESERVED or byte in keep:
        return chr(byte)
    return f"%{byte:02X}"


def match_pattern(pattern: str, path: str) -> bool:
    """RFC 9309 matching of a normalised pattern against a normalised path: from the
    path's start, `*` any run, a final `$` the path's end. Linear sets of positions,
    not a regex, so a pattern full of `*` cannot backtrack for long."""
    anchored = pattern.endswith("$")
    if anchored:
        pattern = pattern[:-1]
    if "*" not in pattern:
        return path == pattern if anchored else path.startswith(pattern)
    positions = [0]
    for char in pattern:
        if char == "*":
            positions = list(range(positions[0], len(path) + 1))
            continue
        positions = [p + 1 for p in positions if p < len(path) and path[p] == char]
        if not positions:
            return False
    return positions[-1] == len(path) if anchored else True


def parse_robots(body: bytes | str) -> RobotsFile:
    """The groups of a robots.txt body (bytes past `MAX_PARSE_BYTES` are ignored)."""
    if isinstance(body, bytes):
        if len(body) > MAX_PARSE_BYTES:  # cut at a line end: no half rule
            cut = body[:MAX_PARSE_BYTES]
            body = cut[: max(cut.rfind(b"\n"), cut.rfind(b"\r")) + 1] or cut
        text = body.decode("utf-8", errors="surrogateescape")
    else:
        text = body
    groups: dict[str, Group] = {}
    agents: list[str] = []
    in_rules = True  # the next user-agent line starts a new group
    for number, key, value in _lines(text.removeprefix("\ufeff")):
        if key in _GLOBAL_KEYS:
            continue
        if key == "user-agent":
            if in_rules:
                agents, in_rules = [], False
            token = "*" if value.startswith("*") else product_token(value)
            if token:
                agents.append(token)
                groups.setdefault(token, Group())  # named, even if it has no rules
            continue
        in_rules = True
        for agent in agents:
            _add(groups.setdefault(agent, Group()), key, value, number)
    return RobotsFile(groups)


def _add(group: Group, key: str, value: str, number: int) -> None:
    if key in ("allow", "disallow"):
        pattern = path_pattern(value)
        if pattern:
            text = f"{'Allow' if key == 'allow' else 'Disallow'}: {_printable(value)}"
            group.rules.append(Rule(key == "allow", pattern, number, text))
    elif key == "crawl-delay" and group.crawl_delay is None:
        group.crawl_delay = _delay(value)


def _printable(value: str, limit: int = 200) -> str:
    """A rule's value fit for an error message: undecodable bytes replaced (they would
    not encode as UTF-8 on the way to Redis or a log), at most `limit` characters."""
    text = value.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + "…"


def path_pattern(value: str) -> str:
    """A rule's value as a normalised pattern; "" for an empty value (no rule)."""
    if not value:
        return ""
    value = re.sub(r"\*+", "*", value)
    value = normalise(value if value.startswith(("/", "*")) else "/" + value, pattern=True)
    # Only a final `$` anchors; elsewhere it is the character itself.
    return value[:-1].replace("$", "%24") + value[-1]


def _delay(value: str) -> float | None:
    try:
        delay = float(value)
    except ValueError:
        return None
    return delay if math.isfinite(delay) and delay >= 0 else None


def _lines(text: str) -> Iterable[tuple[int, str, str]]:
    """(line number, canonical key, value) of each line that has a known key."""
    for number, line in enumerate(re.split(r"\r\n|\r|\n", text), start=1):
        split = _split(line.split("#", 1)[0].strip())
        if split is not None:
            yield number, split[0], split[1].strip()


def _split(line: str) -> tuple[str, str] | None:
    """A line's canonical key and its value; None for a line without a known key.

    Besides `key: value`, `key value` is accepted (no colon, or a colon only inside a
    URL value, as in `Sitemap https://...`), as Google's parser does."""
    key, sep, value = line.partition(":")
    canonical = _KEYS.get(" ".join(key.lower().split()))
    if sep and canonical is not None:
        return canonical, value
    if sep and not value.startswith("//"):
        # An unknown `field: value` line still ends a list of user-agent lines.
        return ("other", value) if key.strip() else None
    lowered = line.lower()
    for name in _KEYS_LONGEST_FIRST:
        if lowered.startswith(name) and (len(line) == len(name) or line[len(name)].isspace()):
            return _KEYS[name], line[len(name) :]
    return None
