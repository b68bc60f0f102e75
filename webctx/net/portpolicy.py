"""Which ports a fetch may connect to (the address guard's companion).

Web pages live on 80 and 443; an odd port on a public host is more often an admin
console, a mail or database port reached through an open redirect. Odd ports stay open
for networks the operator allowed explicitly (WEBCTX_ALLOWED_NETWORKS), and for non-public
addresses when WEBCTX_ALLOW_PRIVATE_NETWORKS lifts the guard.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Sequence
from urllib.parse import urlsplit

from webctx.errors import BlockedURL, FetchError
from webctx.net.addresses import (
    AddressPolicy,
    IPAddress,
    Resolver,
    check_url,
    is_forbidden_address,
    normalise_ip,
    resolve_checked,
    system_resolver,
)


def check_port(
    host: str,
    port: int,
    addresses: Sequence[IPAddress],
    *,
    policy: AddressPolicy,
    allowed_ports: Collection[int],
) -> None:
    """Raise BlockedURL unless `port` is allowed for every one of `addresses`."""
    if port in allowed_ports:
        return
    networks = [ipaddress.ip_network(n, strict=False) for n in policy.allowed_networks]
    for address in addresses:
        ip = normalise_ip(address)
        if any(ip in net for net in networks):
            continue
        if policy.allow_private and is_forbidden_address(ip):
            continue
        raise BlockedURL(host, f"port {port} not allowed for {ip} (WEBCTX_FETCH__ALLOWED_PORTS)")


def check_target(
    url: str,
    *,
    policy: AddressPolicy,
    allowed_ports: Collection[int],
    resolver: Resolver = system_resolver,
) -> None:
    """Raise BlockedURL if a fetch of `url` would be refused now: its form (scheme,
    userinfo), its host's addresses or its port. A name that does not resolve passes: it
    may resolve later, and every fetch checks again."""
    check_url(url)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        addresses = resolve_checked(host, port, policy=policy, resolver=resolver)
    except BlockedURL:
        raise
    except FetchError:
        return
    check_port(host, port, addresses, policy=policy, allowed_ports=allowed_ports)
