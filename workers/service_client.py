"""A local client's way to the local service (`webctx service run`, webctx/workers/service.py):
find the one running for the data directory, or start it, detached.

Every local client of the default setup (no CELERY_BROKER_URL) talks to the service's
Valkey: the job store, the caches and the index live there, and so do the Celery queues
its worker consumes. So a client needs only the socket: it imports no model, no vector
engine and no Celery worker (tests/integration/test_service.py checks `sys.modules`).

Files in the data directory:
- `service.lock`: the service holds an exclusive `flock` on it for its whole life; the
  kernel drops it when the process dies, even by SIGKILL, so a free lock means no service,
  whatever files a dead one left behind.
- `service.json`: its pid and socket, written once its Valkey answers; a client touches it
  at every request (its modification time is the service's idle clock).
- `service-start.lock`: held by the client that starts a service, so several clients
  starting at once start one.
- `service-settings.lock`: held by a client restarting the service with its own settings
  (webctx/workers/service_settings.py), so clients with other settings take turns.
- `service.log`: the service's output.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from webctx.errors import ConfigError
from webctx.workers import strays
from webctx.workers.resp import RespConnection
from webctx.workers.strays import Stray

logger = logging.getLogger("webctx.service")

LOCK_FILE = "service.lock"
ADDRESS_FILE = "service.json"
START_LOCK_FILE = "service-start.lock"
LOG_FILE = "service.log"
START_TIMEOUT_S = 60.0
PRESENCE_PREFIX = "webctx:"
"""A client's connection name on the service's Valkey (its CLIENT LIST names every local
process using the service)."""


@dataclass(frozen=True)
class ServiceInfo:
    """A running service: its pid and the Valkey socket it serves on."""

    pid: int
    socket: str
    settings: str = ""
    """The fingerprint of the environment and config file it was started with
    (`settings_fingerprint`)."""
    inbox: str | None = None
    """The Valkey list it takes research requests from (webctx/api/inbox.py), if any."""
    salt: str = ""
    digests: Mapping[str, str] = field(default_factory=dict)
    """A salted digest of each setting it runs with that a job's result depends on
    (webctx/workers/service_settings.py): compared, never shown."""

    @property
    def state_url(self) -> str:
        """The redis-py URL of its Valkey (database 0)."""
        return f"unix://{self.socket}?db=0"


_in_service = False
_presence: dict[Path, RespConnection] = {}
_children: list[subprocess.Popen[bytes]] = []
_lock = threading.Lock()


def mark_service_process() -> None:
    """This process is the service: it serves the state itself, never asks for it."""
    global _in_service
    _in_service = True


def in_service_process() -> bool:
    """True inside `webctx service run`."""
    return _in_service


def broker_url(data_dir: Path) -> str:
    """The Celery broker URL of the data directory's service (its Valkey's socket): a pure
    function of the directory, so the Celery config needs no running service."""
    from webctx.workers.state_server import socket_path

    return f"socket://{socket_path((data_dir / 'valkey').resolve())}"


def running_service(data_dir: Path) -> ServiceInfo | None:
    """The service of `data_dir` when one holds the lock and has written its address."""
    state = _probe(data_dir)
    return state if isinstance(state, ServiceInfo) else None


def ensure_service(data_dir: Path, *, timeout_s: float = START_TIMEOUT_S) -> ServiceInfo:
    """The running service of `data_dir`, started (detached) when none holds its lock; its
    idle clock is reset. Safe when many clients call it at once: one service starts."""
    with _lock:
        for child in list(_children):  # reap services this process started that exited
            if child.poll() is not None:
                _children.remove(child)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    started: subprocess.Popen[bytes] | None = None
    while True:
        state = _probe(data_dir)
        if isinstance(state, ServiceInfo):
            _touch(data_dir)
            _be_present(data_dir, state)
            return state
        if state == "free" and started is None:
            started = _start_once(data_dir)
        if started is not None and started.poll() not in (None, 0):
            raise ConfigError(f"the local service did not start: {_log_tail(data_dir)}")
        if time.monotonic() > deadline:
            raise ConfigError(f"the local service did not answer in {timeout_s:g} s: "
                              f"{_log_tail(data_dir)}")  # fmt: skip
        time.sleep(0.01)


STOP_TIMEOUT_S = 15.0
"""A stopping service hands its running tasks back within seconds (webctx/workers/
service.py); one still running after this long is killed."""


CHILD_EXIT_S = 1.0
"""The service's children see it gone and exit by themselves within this."""


@dataclass(frozen=True)
class Stopped:
    """What `stop_service` ended: the service's pid (None when none ran), whether it had
    to be killed, the other processes of the data directory it ended, and how long it took."""

    pid: int | None
    killed: bool
    left: list[Stray]
    seconds: float


def stop_service(data_dir: Path, *, timeout_s: float = STOP_TIMEOUT_S) -> Stopped:
    """Stop the service of `data_dir` (SIGTERM: its running tasks go back to their queues,
    its queued ones wait in Valkey for the next start), SIGKILL it after `timeout_s`, then
    end whatever else of the data directory still runs (a Valkey a dead service left, an
    orphaned child)."""
    started, began = time.monotonic(), time.time()
    pid = service_holder(data_dir)
    killed = False
    if pid is not None:
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _probe(data_dir) != "free" or strays.alive(pid):
            if time.monotonic() > deadline:
                _signal(pid, signal.SIGKILL)
                killed = True
                strays.wait_ended([pid], 5.0)
                break
            time.sleep(0.02)
    left: list[Stray] = []
    if _probe(data_dir) == "free":  # else a waiting client has started a service again
        # Nor a process of one starting right now: only those older than this stop.
        found = [p for p in strays.directory_processes(data_dir) if p.age_s > time.time() - began]
        strays.wait_ended([p.pid for p in found], CHILD_EXIT_S)  # its children, on their way
        left = [p for p in found if strays.alive(p.pid)]
        strays.end([p.pid for p in left])
    return Stopped(pid, killed, left, round(time.monotonic() - started, 2))


def service_holder(data_dir: Path) -> int | None:
    """The pid of the process holding the service's lock (running or still starting), or
    None when the lock is free."""
    if _probe(data_dir) == "free":
        return None
    try:
        return int((data_dir / LOCK_FILE).read_text().strip())
    except (OSError, ValueError):
        return None  # written just after the lock is taken: a moment later it is there


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _probe(data_dir: Path) -> ServiceInfo | str:
    """ "free" (no service holds the lock), "starting" (held, no address yet) or the info."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return "free"
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # held: a service runs
    else:
        return "free"  # closing the fd drops the lock we took
    finally:
        os.close(fd)
    try:
        info = json.loads((data_dir / ADDRESS_FILE).read_text())
        inbox, digests = info.get("inbox"), info.get("digests") or {}
        service = ServiceInfo(pid=int(info["pid"]), socket=str(info["socket"]),
                              settings=str(info.get("settings", "")),
                              inbox=str(inbox) if inbox else None,
                              salt=str(info.get("salt", "")),
                              digests={str(k): str(v) for k, v in digests.items()})  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return "starting"
    return service if Path(f"/proc/{service.pid}").exists() else "starting"


def _start_once(data_dir: Path) -> subprocess.Popen[bytes] | None:
    """Start a service unless another client did while we waited for the start lock."""
    with (data_dir / START_LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _probe(data_dir) != "free":
            return None
        child = spawn_service(data_dir)
        # Hold the start lock until the service holds its own: the next client then sees
        # it starting instead of starting a second one that would only exit.
        deadline = time.monotonic() + START_TIMEOUT_S
        while _probe(data_dir) == "free" and child.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        return child


def spawn_service(data_dir: Path) -> subprocess.Popen[bytes]:
    """`webctx service run` detached: its own session (a Ctrl-C in the client's terminal
    does not reach it), the data directory as working folder, output to its log. It runs
    with this process's environment, so with the settings of the client that started it."""
    env = dict(os.environ, WEBCTX_DATA_DIR=str(data_dir))
    with (data_dir / LOG_FILE).open("ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "webctx.cli", "service", "run"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=data_dir, env=env,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    with _lock:
        _children.append(child)
    return child


NOT_COMPARED = frozenset({
    "WEBCTX_DATA_DIR", "WEBCTX_CONFIG_FILE", "WEBCTX_LOG_FORMAT", "WEBCTX_LOG_LEVEL",
    "WEBCTX_METRICS_PORT", "WEBCTX_METRICS_HOST", "WEBCTX_OTEL", "WEBCTX_SERVICE_IDLE_S",
    "WEBCTX_API_HOST", "WEBCTX_API_AUTH", "WEBCTX_API_RATE_LIMIT_PER_MINUTE",
    "WEBCTX_API_CONTEXT_TIMEOUT_S", "WEBCTX_API_MAX_BODY_BYTES", "WEBCTX_MCP_WAIT_S",
})  # fmt: skip
"""Settings a client and the local service may differ in: the data directory names the
service, the config file's place is not its contents, and the rest change no job's result
(logs, metrics and traces; how long the idle service lives; the HTTP API's and the MCP
server's own, applied by the process that serves them). docs/configuration.md."""


def settings_fingerprint(environ: Mapping[str, str]) -> str:
    """A digest of the settings in `environ` (WEBCTX_*, CELERY_*, OPENAI_*; not
    `NOT_COMPARED`, nor the CELERY_LOG_* variables a Celery worker writes into its own
    environment as it starts) and in the config file it names: the service records its
    own. Equal, a client and the service read the same settings (not equal, they may
    still: webctx/workers/service_settings.py compares the values)."""
    from webctx.config_file import file_values
    from webctx.errors import ConfigError
    from webctx.search_names import VENDOR_KEY_ENV

    def kept(items: Mapping[str, str]) -> list[tuple[str, str]]:
        prefixes = ("WEBCTX_", "CELERY_", "OPENAI_", *VENDOR_KEY_ENV.values())
        return sorted((k, v) for k, v in items.items()
                      if k.startswith(prefixes) and k not in NOT_COMPARED
                      and not k.startswith("CELERY_LOG_"))  # fmt: skip

    try:
        in_file = kept(file_values(environ))
    except ConfigError as exc:  # never equal to a service's: the settings say why
        in_file = [("error", str(exc))]
    return hashlib.sha256(json.dumps([kept(environ), in_file]).encode()).hexdigest()[:16]


def _touch(data_dir: Path) -> None:
    """Reset the service's idle clock (the address file's modification time)."""
    try:
        os.utime(data_dir / ADDRESS_FILE)
    except OSError:
        pass  # a service exiting right now: the next call starts another


def _be_present(data_dir: Path, info: ServiceInfo) -> None:
    """Keep one named connection on the service's Valkey while this process lives.

    Two commands on a plain socket rather than a redis-py client: this runs first in every
    client, and importing redis-py (with its optional tracing) costs more than a client's
    whole budget to reach the service (docs/benchmarks.md, service_start)."""
    with _lock:
        present = _presence.pop(data_dir, None)
        if present is not None:
            try:
                if present.call("PING") == b"PONG":
                    _presence[data_dir] = present
                    return
            except OSError:
                pass
            present.close()
        try:
            conn = RespConnection(info.socket)
        except OSError:
            return  # the service is going away: the next call starts another
        try:
            conn.call("CLIENT", "SETNAME", f"{PRESENCE_PREFIX}{os.getpid()}")
        except OSError:
            conn.close()
            return
        _presence[data_dir] = conn


CLIENT_COMMANDS = frozenset(
    {"research", "status", "bundle", "mcp", "api", "sources", "search", "batch", "keys"}
)


def reach_early(argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """For a client command with no broker: reach the service (or start it) in a thread
    while the command loads its modules, so a cold service starts alongside the client's
    imports (the settings this reads, the broker URL and the data directory, are the ones
    webctx.settings reads). Errors are left to the command, which reaches the service
    again through its settings and waits for it there."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in CLIENT_COMMANDS or {"--help", "-h"} & set(argv):
        return
    data_dir = local_data_dir(environ)
    if data_dir is None:
        return

    def reach() -> None:
        try:
            ensure_service(data_dir)
        except (ConfigError, OSError):
            pass

    threading.Thread(target=reach, name="reach-service", daemon=True).start()


def local_data_dir(environ: Mapping[str, str]) -> Path | None:
    """The data directory whose service local clients use, or None with a broker set (read
    from the environment and the config file as webctx.settings reads them, before the
    settings load)."""
    from webctx.config_file import layered

    environ = layered(environ)
    if environ.get("CELERY_BROKER_URL") or environ.get("WEBCTX_BROKER_URL"):
        return None
    import platformdirs

    return Path(environ.get("WEBCTX_DATA_DIR") or platformdirs.user_data_dir("webctx"))


def _log_tail(data_dir: Path) -> str:
    log = data_dir / LOG_FILE
    return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
