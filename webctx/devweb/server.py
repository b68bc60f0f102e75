"""Run an ASGI app on a loopback port in a background thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp


@dataclass
class InFlight:
    """Requests a loopback peer is answering at once: now, and the most seen (thread-safe;
    tests read the overlap of a client's requests from the server's side)."""

    now: int = 0
    most: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Count one request as in flight while the block runs."""
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            yield
        finally:
            with self._lock:
                self.now -= 1


@dataclass
class LoopbackServer:
    """An ASGI app served by uvicorn on `host`, port chosen by the OS. Stopped, its port
    refuses connections; started again, it serves on the same URL (a peer restarted)."""

    app: ASGIApp
    host: str = "127.0.0.1"
    port: int = 0
    _server: uvicorn.Server | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """Base URL without a trailing slash."""
        return f"http://{self.host}:{self.port}"

    def start(self, *, timeout_s: float = 10.0) -> LoopbackServer:
        """Bind, start serving, and return once the socket accepts connections."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", access_log=False, timeout_keep_alive=5
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            daemon=True,
            name=f"srv-{self.port}",
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
