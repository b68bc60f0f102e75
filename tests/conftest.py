"""Shared fixtures: the machine's Redis (a dedicated db, flushed per test), the loopback
test web, and `webctx` subprocesses (workers and the CLI) with a clean environment.

Every test that talks to Redis takes its URL from `redis_url()`: one database per test
process, so pytest-xdist workers never flush each other's state (subprocesses a test
starts get the same URL through their environment)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# Before anything imports webctx: the Celery app takes its default broker, the local
# service's socket in the data directory, at import; no test process may reach the user's.
# Each test then gets its own directory (the `data_dir` fixture).
_SCRATCH = tempfile.mkdtemp(prefix="webctx-test-data-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ["WEBCTX_DATA_DIR"] = _SCRATCH
# Nor the user's config file (~/.config/webctx/config.toml): every test process, and each
# subprocess (`clean_env` passes it on), reads one that does not exist unless a test
# points WEBCTX_CONFIG_FILE at its own.
os.environ["WEBCTX_CONFIG_FILE"] = os.path.join(_SCRATCH, "no-config.toml")

import pytest  # noqa: E402
import redis  # noqa: E402

from tests import netguard  # noqa: E402
from tests.scheduling import pytest_collection_modifyitems  # noqa: E402, F401
from tests.testweb import LoopbackWeb, start_test_web  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REDIS_HOST = os.environ.get("WEBCTX_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("WEBCTX_TEST_REDIS_PORT", "6379"))
netguard.install()


@pytest.fixture(autouse=True)
def no_packet_off_machine() -> Iterator[None]:
    """Fail any test that tried to connect beyond loopback (tests/netguard.py)."""
    netguard.take_attempts()
    yield
    tried = netguard.take_attempts()
    if tried:
        pytest.fail(f"the test tried to connect beyond loopback: {', '.join(tried)}")


MAX_XDIST_WORKERS = 10
"""Databases 1-10 serve pytest-xdist workers gw0-gw9; 11 a run without xdist; 13-15 the
benchmarks (bench/)."""


def _test_db() -> int:
    """This test process's database: 1 + N for xdist worker gwN, else WEBCTX_TEST_REDIS_DB."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return int(os.environ.get("WEBCTX_TEST_REDIS_DB", "11"))
    number = int(worker.removeprefix("gw"))
    if number >= MAX_XDIST_WORKERS:
        raise RuntimeError(f"at most {MAX_XDIST_WORKERS} xdist workers (one Redis db each)")
    return 1 + number


REDIS_DB = _test_db()


def redis_url(db: int = REDIS_DB) -> str:
    """URL of this test process's database on the test Redis."""
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{db}"


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    """A real Redis connection to the test db, flushed before and after the test."""
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.fail(f"no Redis at {redis_url()}: run scripts/ensure-redis (make test does)")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def test_web() -> Iterator[LoopbackWeb]:
    """The loopback web shared by the integration tests."""
    web = start_test_web()
    yield web
    web.stop()


@pytest.fixture(scope="session", autouse=True)
def session_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The WEBCTX_DATA_DIR of processes that module- or session-wide fixtures start."""
    path = tmp_path_factory.mktemp("webctx-data")
    before = os.environ.get("WEBCTX_DATA_DIR")
    os.environ["WEBCTX_DATA_DIR"] = str(path)
    yield path
    _leave_state_servers(path)
    if before is None:
        os.environ.pop("WEBCTX_DATA_DIR", None)
    else:
        os.environ["WEBCTX_DATA_DIR"] = before


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test's own WEBCTX_DATA_DIR (`clean_env` passes it on), so no test touches the
    user's data directory or another test's state server; a server left running there
    (a starter killed by the test) is stopped afterwards."""
    path = tmp_path / "webctx-data"
    monkeypatch.setenv("WEBCTX_DATA_DIR", str(path))
    yield path
    _leave_state_servers(path)


def _leave_state_servers(data_dir: Path) -> None:
    """Leave the servers this process uses, and kill the local service and the state
    server still running in `data_dir`."""
    if "webctx.workers.state_server" in sys.modules:
        from webctx.workers.state_server import release_all

        release_all()
    if not data_dir.exists():  # nothing ever ran there: no scan of /proc (most unit tests)
        return
    kill_service(data_dir)
    stop_state_server(data_dir)


def service_pid(data_dir: Path) -> int | None:
    """The pid of the local service holding `data_dir`'s lock, if one runs."""
    try:
        pid = int((data_dir / "service.lock").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"service\x00run" in cmdline else None


def local_services(data_dir: Path) -> list[int]:
    """Pids of every `webctx service run` of `data_dir`: the one holding its lock, and one
    a client started that has not taken the lock yet (its working folder is the data
    directory)."""
    target, found = data_dir.resolve(), []
    for proc in Path("/proc").iterdir():
        try:
            if b"service\x00run" not in (proc / "cmdline").read_bytes():
                continue
            if Path(os.readlink(proc / "cwd")) == target:
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def kill_service(data_dir: Path) -> None:
    """SIGKILL every local service of `data_dir` still running."""
    for pid in local_services(data_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def state_server_pid(data_dir: Path) -> int | None:
    """The pid of the state server (Valkey) whose pid file lies in `data_dir`, if it runs."""
    try:
        pid = int((data_dir / "valkey" / "valkey.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"valkey-server" in cmdline or b"redis-server" in cmdline else None


def valkey_pids(data_dir: Path) -> list[int]:
    """Pids of every running Valkey serving `data_dir`'s socket, read from /proc (whatever
    its pid file says)."""
    sock = os.fsencode(data_dir.resolve() / "valkey" / "valkey.sock")
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"valkey-server" in cmdline and sock in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def stop_state_server(data_dir: Path) -> None:
    """SIGKILL every state server of `data_dir` still running."""
    pid = state_server_pid(data_dir)
    for server in {*valkey_pids(data_dir), *([pid] if pid is not None else [])}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without webctx/Celery/OpenAI settings (but the test's
    WEBCTX_DATA_DIR and WEBCTX_CONFIG_FILE), plus `extra`."""
    prefixes = ("WEBCTX_", "CELERY_", "OPENAI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    for kept in ("WEBCTX_DATA_DIR", "WEBCTX_CONFIG_FILE"):
        if kept in os.environ:
            env[kept] = os.environ[kept]
    env["PYTHONPATH"] = str(ROOT)
    # A local service a test leaves behind (its fixture kills it) exits on its own too.
    env["WEBCTX_SERVICE_IDLE_S"] = "60"
    env.update(extra)
    return env


class CliProcess:
    """A `webctx ARGS` subprocess in its own process group, output in a log file."""

    kind = "process"

    def __init__(self, env: dict[str, str], args: list[str], *, log: Path) -> None:
        self.log = log
        self._fh = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "webctx.cli", *args],
            env=env,
            cwd=ROOT,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ready(self) -> bool:
        """True once the process serves."""
        raise NotImplementedError

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Block until ready (generous by default: CI machines are shared)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {self.log.read_text()[-3000:]}")
            if self.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} not ready: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM (warm shutdown), then SIGKILL the whole process group if needed."""
        self.terminate()
        self.wait_stopped()

    def terminate(self) -> None:
        """Ask for a warm shutdown (SIGTERM to the process group) without waiting."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_stopped(self) -> None:
        """Wait up to 15 s for the process to end, then SIGKILL its process group."""
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._fh.close()


class WorkerProcess(CliProcess):
    """A `webctx worker` subprocess."""

    kind = "worker"

    def __init__(self, env: dict[str, str], *args: str, log: Path) -> None:
        super().__init__(env, ["worker", "--loglevel", "INFO", *args], log=log)

    def ready(self) -> bool:
        """True once the worker logged that it consumes."""
        return b"ready." in self.log.read_bytes()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[object]:
    """Factory: start `webctx worker` subprocesses that are stopped after the test."""
    started: list[WorkerProcess] = []

    def start(env: dict[str, str], *args: str) -> WorkerProcess:
        worker = WorkerProcess(env, *args, log=tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:  # all asked at once: their warm shutdowns overlap
        worker.terminate()
    for worker in started:
        worker.wait_stopped()


def run_cli(
    env: dict[str, str], *args: str, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run `webctx ARGS` in a subprocess and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "webctx.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def as_at_a_terminal() -> None:
    """`preexec_fn` of a command the test sends Ctrl-C: SIGINT at its default, as a shell's
    foreground command has it. A child inherits an ignored SIGINT (a suite's worker may
    have been left so), and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
