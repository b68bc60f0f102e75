"""A few commands to the local service's Valkey on a plain unix socket (RESP2).

Local clients reach the service before they load anything heavy: importing redis-py (with
its optional tracing) costs more than a client's whole budget to reach the service and
hand it a request (docs/benchmarks.md, service_start and latency). This speaks just the
protocol those few commands need: a command is an array of bulk strings; a reply is a
simple string, an error, an integer, a bulk string or an array of those (or nil).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

Reply = bytes | int | None | list["Reply"]


class RespError(OSError):
    """The server answered with an error (`-ERR ...`), or the connection broke."""


class RespConnection:
    """One connection to a unix socket; not thread-safe."""

    def __init__(self, path: str, *, timeout_s: float = 10.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        self._buffer = b""
        try:
            self._sock.connect(path)
        except OSError:
            self._sock.close()
            raise

    def call(self, *words: str | bytes | int | float, timeout_s: float | None = None) -> Reply:
        """Send one command; its reply (`timeout_s`: the socket's for this call, as long
        as a blocking command may wait plus a margin)."""
        if timeout_s is not None:
            self._sock.settimeout(timeout_s)
        self._sock.sendall(encode(words))
        return self._reply()

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()

    def __enter__(self) -> RespConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _line(self) -> bytes:
        while b"\r\n" not in self._buffer:
            self._fill()
        line, _, self._buffer = self._buffer.partition(b"\r\n")
        return line

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size + 2:
            self._fill()
        data, self._buffer = self._buffer[:size], self._buffer[size + 2 :]
        return data

    def _fill(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise RespError("connection closed")
        self._buffer += chunk

    def _reply(self) -> Reply:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._exactly(size)
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._reply() for _ in range(count)]
        raise RespError(f"unexpected reply {line[:40]!r}")


def encode(words: Sequence[str | bytes | int | float]) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(words)]
    for word in words:
        data = word if isinstance(word, bytes) else str(word).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)
