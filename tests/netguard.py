"""No test sends a packet off the machine: every socket connect of the test process to an
address that is not loopback is refused (OSError) and recorded, and the `no_packet_off_machine`
fixture (autouse, tests/conftest.py) fails the test that tried, even when the code under
test swallowed the error. Subprocesses (workers) are not covered: their peers come from
the test's environment, which names loopback peers only."""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

_lock = threading.Lock()
attempts: list[str] = []
"""Addresses a test tried to connect to beyond loopback, since the last check."""
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


class BeyondLoopback(ConnectionRefusedError):
    """A test tried to connect to an address off the machine."""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:  # a name: connect would resolve it, maybe off the machine
        return False


def check_address(sock: socket.socket, address: Any) -> None:
    """Raise BeyondLoopback (and record it) for an inet address that is not loopback."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    host = str(address[0]) if isinstance(address, tuple) else str(address)
    if _loopback(host):
        return
    with _lock:
        attempts.append(f"{host}:{address[1] if isinstance(address, tuple) else ''}")
    raise BeyondLoopback(f"tests never connect beyond loopback (tried {host})")


def _connect(self: socket.socket, address: Any) -> None:
    check_address(self, address)
    _real_connect(self, address)


def _connect_ex(self: socket.socket, address: Any) -> int:
    check_address(self, address)
    return _real_connect_ex(self, address)


def install() -> None:
    """Refuse non-loopback connects in this process (idempotent)."""
    socket.socket.connect = _connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]


def take_attempts() -> list[str]:
    """The attempts recorded since the last call, cleared."""
    with _lock:
        found = list(attempts)
        attempts.clear()
    return found
