"""The suite's guard against packets off the machine (tests/netguard.py): a connect beyond
loopback is refused before anything is sent, and recorded for the test's teardown."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests import netguard


def test_a_connect_beyond_loopback_is_refused_and_recorded() -> None:
    with pytest.raises(netguard.BeyondLoopback, match="192.0.2.1"):
        socket.create_connection(("192.0.2.1", 80), timeout=1)
    with pytest.raises(httpx.ConnectError):  # what an adapter sees: no connection
        httpx.get("http://198.51.100.7:8080/", timeout=1)
    assert netguard.take_attempts() == ["192.0.2.1:80", "198.51.100.7:8080"]


def test_loopback_connects_go_through() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=1):
            pass
    with socket.socket() as refused:
        assert refused.connect_ex(("127.0.0.2", 9)) != 0  # loopback: allowed, just closed
    assert netguard.take_attempts() == []
