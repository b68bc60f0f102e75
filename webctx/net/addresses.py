"""The safe-URL policy: which URLs and which resolved addresses a fetch may reach.

The fetcher calls `check_url` on every hop and `resolve_checked` inside its connect
step, then connects to an address this module returned (no second DNS lookup).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from webctx.errors import BlockedURL, ConfigError, FetchError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]
"""Maps (host, port) to IP address strings, like a filtered `socket.getaddrinfo`."""

ALLOWED_SCHEMES = frozenset({"http", "https"})

# Cloud metadata endpoints stay blocked even with allow_private: reaching them from a
# crawler leaks instance credentials. Most are link-local/private already; listed on purpose.
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
)
# No ipaddress property exists for NAT64 (RFC 6052 / RFC 8215): the well-known prefix
# embeds an IPv4 address; the local-use prefix can reach anything behind the translator.
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
# inet_aton part: hex, octal or decimal, ASCII only (int() alone would take "1_0" or "١").
_INET_ATON_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def check_url(url: str) -> None:
    """Raise BlockedURL unless `url` is an absolute http(s) URL with a host and no userinfo."""
    if "\\" in url or any(ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in url):
        # Parsers disagree on backslashes and control characters; refuse the ambiguity.
        raise BlockedURL(url, "malformed URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - property raises ValueError on a bad port
    except ValueError as exc:
        raise BlockedURL(url, f"malformed URL: {exc}") from exc
    if parts.scheme.lower() not in ALLOWED_SCHEMES:
        raise BlockedURL(url, f"scheme {parts.scheme!r} not allowed")
    if "@" in parts.netloc:
        raise BlockedURL(url, "credentials in URL not allowed")
    if not parts.hostname:
        raise BlockedURL(url, "URL has no host")


def parse_ip_host(host: str) -> IPAddress | None:
    """The address a host string denotes as a literal (inet_aton forms included), else None."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    return _parse_inet_aton(host)


def _parse_inet_aton(host: str) -> ipaddress.IPv4Address | None:
    # The system resolver accepts 2130706433, 0x7f.1, 0177.1 and 127.1 as 127.0.0.1;
    # parse them the same way so the guard and the resolver agree.
    parts = host.rstrip(".").split(".")
    if not 1 <= len(parts) <= 4 or not all(_INET_ATON_PART.fullmatch(p) for p in parts):
        return None
    values = [_inet_aton_value(p) for p in parts]
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        return None
    number = last
    for index, value in enumerate(head):
        number += value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def _inet_aton_value(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        return int(part[1:], 8)
    return int(part, 10)


def normalise_ip(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address embeds (mapped, 6to4, NAT64), else `ip` itself."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64_WELL_KNOWN:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def is_forbidden_address(ip: IPAddress) -> bool:
    """True if `ip` (after normalisation) is not a public unicast address."""
    ip = normalise_ip(ip)
    if isinstance(ip, ipaddress.IPv6Address) and (ip in _NAT64_LOCAL_USE or ip.is_site_local):
        return True
    return (
        not ip.is_global  # private, CGNAT, documentation, benchmarking, ...
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local  # 169.254/16 incl. metadata, fe80::/10
        or ip.is_multicast  # some multicast ranges count as is_global
        or ip.is_reserved  # 240/4, ::/8 (IPv4-compatible IPv6)
        or ip.is_unspecified
        or ip in _METADATA_ADDRESSES
    )


@dataclass(frozen=True)
class AddressPolicy:
    """Which resolved addresses a fetch may connect to."""

    allow_private: bool = False
    allowed_networks: Sequence[str] = ()
    _networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            networks = tuple(ipaddress.ip_network(n, strict=False) for n in self.allowed_networks)
        except ValueError as exc:
            raise ConfigError(f"bad allowed network: {exc}") from exc
        object.__setattr__(self, "allowed_networks", tuple(self.allowed_networks))
        object.__setattr__(self, "_networks", networks)

    def is_allowed(self, ip: IPAddress) -> bool:
        """True if a connection to `ip` is permitted."""
        ip = normalise_ip(ip)
        if any(ip in net for net in self._networks):
            return True
        if ip in _METADATA_ADDRESSES:
            return False
        return self.allow_private or not is_forbidden_address(ip)

    def check_ip(self, ip: IPAddress) -> None:
        """Raise BlockedURL unless a connection to `ip` is permitted."""
        if not self.is_allowed(ip):
            raise BlockedURL(str(ip), f"address {ip} is not allowed")


def system_resolver(host: str, port: int) -> list[str]:
    """The TCP addresses of `host` from the system resolver, in its order, deduplicated."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def resolve_checked(
    host: str, port: int, *, policy: AddressPolicy, resolver: Resolver = system_resolver
) -> list[IPAddress]:
    """Addresses of `host`, all permitted by `policy`; raises BlockedURL if any is not."""
    literal = parse_ip_host(host)
    if literal is not None:
        policy.check_ip(literal)
        return [literal]
    try:
        found = resolver(host, port)
        addresses = [ipaddress.ip_address(a) for a in found]
    except (OSError, UnicodeError, ValueError) as exc:
        raise FetchError(host, f"cannot resolve {host!r}: {exc}") from exc
    if not addresses:
        raise FetchError(host, f"cannot resolve {host!r}: no addresses")
    # Refuse the host if ANY address is forbidden: a name mixing public and private
    # addresses is a rebinding setup, and the connect order is not ours to trust.
    for address in addresses:
        if not policy.is_allowed(address):
            raise BlockedURL(host, f"{host!r} resolves to disallowed address {address}")
    return addresses
