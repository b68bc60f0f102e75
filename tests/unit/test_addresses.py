"""The safe-URL policy: URL shapes, forbidden address ranges, numeric host forms, DNS stubs.

Nothing here opens a socket: resolvers are stubs, and literal hosts never reach them.
"""

from __future__ import annotations

import ipaddress
import socket

import pytest

from webctx.errors import BlockedURL, ConfigError, FetchError
from webctx.net.addresses import (
    AddressPolicy,
    Resolver,
    check_url,
    is_forbidden_address,
    parse_ip_host,
    resolve_checked,
)

DEFAULT = AddressPolicy()
LOOPBACK_ONLY = AddressPolicy(allowed_networks=["127.0.0.1/32"])


def no_dns(host: str, port: int) -> list[str]:
    """A resolver that fails the test if anything asks it."""
    raise AssertionError(f"resolver called for {host}:{port}")


def stub_dns(table: dict[str, list[str]]) -> tuple[list[str], Resolver]:
    """A resolver answering from `table`, and the list of hosts it was asked for."""
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return table[host]

    return calls, resolve


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.255.254",
        "10.0.0.1",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "100.64.0.1",
        "100.127.255.254",
        "169.254.0.1",
        "169.254.169.254",
        "0.0.0.0",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "192.0.2.1",
        "198.18.0.1",
        "::1",
        "::",
        "fc00::1",
        "fd00:ec2::254",
        "fe80::1",
        "fec0::1",
        "ff02::1",
        "ff0e::1",
        "2001:db8::1",
        "::7f00:1",
    ],
)
def test_forbidden_ranges_are_refused(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert is_forbidden_address(ip)
    with pytest.raises(BlockedURL):
        DEFAULT.check_ip(ip)


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",  # IPv4-mapped
        "2002:7f00:1::",
        "2002:a9fe:a9fe::1",  # 6to4 wrapping loopback, metadata
        "64:ff9b::a00:1",
        "64:ff9b::7f00:1",
        "64:ff9b:1::1",  # NAT64
    ],
)
def test_ipv6_wrapping_forbidden_ipv4_is_refused(address: str) -> None:
    assert is_forbidden_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    [
        "93.184.215.14",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "::ffff:93.184.215.14",
        "2002:5db8:d70e::1",
    ],
)
def test_public_addresses_are_allowed(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert not is_forbidden_address(ip)
    DEFAULT.check_ip(ip)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("10.1", "10.0.0.1"),
        ("169.254.43518", "169.254.169.254"),
        ("[::1]", "::1"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
    ],
)
def test_numeric_host_forms_are_parsed_like_the_system_resolver(host: str, expected: str) -> None:
    assert parse_ip_host(host) == ipaddress.ip_address(expected)


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",
        "0x7f.1",
        "127.1",
        "0177.0.0.1",
        "0",
        "017700000001",
        "169.254.43518",
        "[::ffff:127.0.0.1]",
    ],
)
def test_numeric_host_forms_are_refused_without_dns(host: str) -> None:
    with pytest.raises(BlockedURL):
        resolve_checked(host, 80, policy=DEFAULT, resolver=no_dns)


@pytest.mark.parametrize("host", ["example.com", "1.2.3.4.5", "256.1", "1_0", "08", "a.1"])
def test_names_are_not_mistaken_for_addresses(host: str) -> None:
    assert parse_ip_host(host) is None


def test_resolved_private_address_is_refused() -> None:
    calls, resolve = stub_dns({"internal.test": ["10.0.0.7"]})
    with pytest.raises(BlockedURL, match="10.0.0.7"):
        resolve_checked("internal.test", 443, policy=DEFAULT, resolver=resolve)
    assert calls == ["internal.test"]


def test_name_mixing_public_and_private_addresses_is_refused() -> None:
    _, resolve = stub_dns({"rebind.test": ["93.184.215.14", "127.0.0.1"]})
    with pytest.raises(BlockedURL):
        resolve_checked("rebind.test", 80, policy=DEFAULT, resolver=resolve)


def test_public_name_resolves_to_checked_addresses() -> None:
    _, resolve = stub_dns({"example.test": ["93.184.215.14", "2606:2800:21f:cb07::1"]})
    found = resolve_checked("example.test", 80, policy=DEFAULT, resolver=resolve)
    assert [str(a) for a in found] == ["93.184.215.14", "2606:2800:21f:cb07::1"]


def test_resolver_failure_is_a_fetch_error_not_a_block() -> None:
    def failing(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(FetchError) as info:
        resolve_checked("nowhere.test", 80, policy=DEFAULT, resolver=failing)
    assert not isinstance(info.value, BlockedURL)
    with pytest.raises(FetchError):
        resolve_checked("empty.test", 80, policy=DEFAULT, resolver=lambda h, p: [])


def test_allowed_networks_lift_exactly_one_network() -> None:
    for ok in ("127.0.0.1", "::ffff:127.0.0.1"):
        LOOPBACK_ONLY.check_ip(ipaddress.ip_address(ok))
    for refused in ("127.0.0.2", "10.0.0.1", "::1", "169.254.169.254"):
        with pytest.raises(BlockedURL):
            LOOPBACK_ONLY.check_ip(ipaddress.ip_address(refused))


def test_allow_private_still_refuses_cloud_metadata() -> None:
    policy = AddressPolicy(allow_private=True)
    policy.check_ip(ipaddress.ip_address("10.0.0.1"))
    policy.check_ip(ipaddress.ip_address("127.0.0.1"))
    for metadata in ("169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254"):
        with pytest.raises(BlockedURL):
            policy.check_ip(ipaddress.ip_address(metadata))


def test_bad_allowed_network_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        AddressPolicy(allowed_networks=["127.0.0.300/32"])


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/",
        "https://example.com:8443/a?b=c#d",
        "HTTP://EXAMPLE.COM",
        "http://[2606:4700::1111]/",
    ],
)
def test_check_url_accepts_http_and_https(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/file",
        "file:///etc/passwd",
        "gopher://example.com/",
        "javascript:alert(1)",
        "http://user:pw@example.com/",
        "http://user@example.com/",
        "http://@example.com/",
        "https://example.com@127.0.0.1/",
        "http:///path",
        "/relative/path",
        "http://example.com:99999/",
        "http://example.com\\@127.0.0.1/",
        "http://exa mple.com/",
        "http://example.com/\r\nX: y",
    ],
)
def test_check_url_refuses_other_schemes_credentials_and_malformed_urls(url: str) -> None:
    with pytest.raises(BlockedURL):
        check_url(url)
