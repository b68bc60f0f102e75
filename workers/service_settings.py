"""A job runs under its caller's settings: the local service's settings against a client's.

The local service of a data directory runs with the settings of whoever started it (its
environment, and the config file, webctx/config_file.py). A client with other settings
(an MCP host started with a minimal environment, a terminal with WEBCTX_SEARXNG_URL
exported, a config file changed since) would otherwise have its job searched, fetched
and embedded as it did not ask. So before a client hands the service work (a job, a
batch, a re-index run, an index search), `work_on_service` compares the settings a
job's result depends on (all but `NOT_COMPARED` of webctx/workers/service_client.py):

- the same: the work goes to the running service;
- different and the service idle (no message queued or held but its own housekeeping):
  the service is restarted with the client's settings, said in one line;
- different and the service busy: refused (`SettingsMismatch`), naming the settings
  that differ (names only: values may be keys) and the ways out.

The service records a salted digest of each value in its address file (`service_record`),
so a client learns which settings differ without any value being written down. A lock in
the data directory (`service-settings.lock`) is held shared while a client hands work over
and exclusive while one restarts the service: no client restarts it between another's
check and that one's message reaching its queue, where the restarting client's check of
what is queued sees it.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import logging
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pydantic import SecretStr
from pydantic_core import to_jsonable_python

from webctx.env_names import setting_names
from webctx.errors import SettingsMismatch, WebctxError
from webctx.keys import FAMILIES
from webctx.settings import Settings
from webctx.workers.deferred import HOUSEKEEPING
from webctx.workers.resp import Reply, RespConnection
from webctx.workers.service_client import (
    NOT_COMPARED,
    ServiceInfo,
    ensure_service,
    in_service_process,
    stop_service,
)

logger = logging.getLogger("webctx.service")

RESTART_LOCK_FILE = "service-settings.lock"


def compared_values(settings: Settings) -> dict[str, str]:
    """Each compared setting's value as JSON, by environment name (secrets in clear:
    digest them, never print them)."""
    values: dict[str, str] = {}
    for name, path in setting_names(Settings).items():
        if name in NOT_COMPARED:
            continue
        value: object = settings
        for part in path:
            value = getattr(value, part)
        if path == ("qdrant_path",) and "qdrant_path" not in settings.model_fields_set:
            value = "<data dir>/qdrant"  # the default follows the data directory
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        values[name] = json.dumps(to_jsonable_python(value), sort_keys=True)
    return values


def _digest(salt: str, name: str, value: str) -> str:
    return hashlib.sha256(f"{salt}\0{name}\0{value}".encode()).hexdigest()[:16]


def service_record(settings: Settings) -> dict[str, object]:
    """What the service writes into its address file about its settings."""
    salt = secrets.token_hex(8)
    values = compared_values(settings)
    return {"salt": salt, "digests": {k: _digest(salt, k, v) for k, v in values.items()}}


def differing(info: ServiceInfo, settings: Settings) -> list[str]:
    """The names of the compared settings whose values differ between the service and
    `settings` (["settings"] for a service that recorded no digests)."""
    if not info.digests:
        return ["settings"]
    mine = {k: _digest(info.salt, k, v) for k, v in compared_values(settings).items()}
    names = mine.keys() | info.digests.keys()
    return sorted(k for k in names if mine.get(k) != info.digests.get(k))


class ServiceRestarting(WebctxError):
    """Inside the service: a client is restarting it, so it takes no more work now (the
    client whose request it holds submits by itself)."""


@contextmanager
def work_on_service(settings: Settings) -> Iterator[ServiceInfo | None]:
    """Hand the local service work inside this block: it runs with `settings` (restarted
    with them first when it was idle with others) and is not restarted by another client
    until the block ends, so the work published here is seen as the service's. None with
    a broker, and inside the service (ServiceRestarting while a client restarts it).
    SettingsMismatch when it runs other settings and is busy."""
    if not settings.embedded:
        yield None
        return
    data_dir = settings.data_dir
    if in_service_process():
        with _turn(data_dir, exclusive=False, wait=False) as held:
            if not held:
                raise ServiceRestarting("the local service is being restarted")
            yield None
        return
    names: list[str] = []
    for _ in range(2):  # another client may restart it between our restart and our turn
        with _turn(data_dir, exclusive=False):
            info = ensure_service(data_dir)
            names = differing(info, settings)
            if not names:
                yield info
                return
        _restart_unless_busy(settings)
    raise SettingsMismatch(names, pid=info.pid, restarted=True)


@contextmanager
def _turn(data_dir: Path, *, exclusive: bool, wait: bool = True) -> Iterator[bool]:
    """The restart lock: shared while work is handed over, exclusive for a restart; True
    when held (without `wait`, False when a restart holds it)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (data_dir / RESTART_LOCK_FILE).open("a") as lock:
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(lock, mode)
        except BlockingIOError:
            yield False
            return
        yield True


def _restart_unless_busy(settings: Settings) -> None:
    """Restart the service with `settings` if it runs others and is idle (said in one
    line); SettingsMismatch if it is busy."""
    data_dir = settings.data_dir
    with _turn(data_dir, exclusive=True):  # no work is being handed to it meanwhile
        info = ensure_service(data_dir)
        names = differing(info, settings)
        if not names:
            return  # another client restarted it with the same settings
        if busy(info):
            raise SettingsMismatch(names, pid=info.pid)
        stop_service(data_dir)
        new = ensure_service(data_dir)
    logger.warning("restarted the local service (pid %s, now %s) with this client's settings: "
                   "%s differed", info.pid, new.pid, ", ".join(names))  # fmt: skip


def busy(info: ServiceInfo) -> bool:
    """True if the service has a message queued, or one held (running, or due later),
    besides its own housekeeping and the deadline watchdogs of ended jobs."""
    from webctx.workers.celeryconfig import queue_lists

    lists = queue_lists()
    try:
        with RespConnection(info.socket) as conn:
            messages: list[bytes] = []
            for name in lists:
                if conn.call("LLEN", name):
                    messages += _items(conn.call("LRANGE", name, 0, -1))
            messages += [_held_message(raw) for raw in _items(conn.call("HVALS", "unacked"))]
            return any(_is_work(conn, message) for message in messages)
    except OSError:
        return False  # its Valkey is gone: nothing left to disturb


def _items(reply: Reply) -> list[bytes]:
    return [item for item in reply if isinstance(item, bytes)] if isinstance(reply, list) else []


def _held_message(raw: bytes) -> bytes:
    """kombu keeps a held message as [message, exchange, routing key]."""
    try:
        return json.dumps(json.loads(raw)[0]).encode()
    except (ValueError, IndexError, TypeError):
        return raw  # unreadable: taken for work


def _is_work(conn: RespConnection, raw: bytes) -> bool:
    """A broker message is a caller's work unless it is housekeeping, or the deadline
    watchdog (`webctx.rank`, force) of a job that has ended. Unreadable: work."""
    try:
        message = json.loads(raw)
        task = message["headers"]["task"]
        if task in HOUSEKEEPING:
            return False
        if task != "webctx.rank":
            return True
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    except (ValueError, KeyError, TypeError):
        return True
    if not (isinstance(kwargs, Mapping) and kwargs.get("force")):
        return True
    return not _job_ended(conn, str(args[0]))


def _job_ended(conn: RespConnection, job_id: str) -> bool:
    """The job's state (webctx.jobs.store.JobStore's `meta` hash) is final, or gone."""
    family = next(f for f in FAMILIES if f.pattern.endswith("{job_id}:{part}"))
    status = conn.call("HGET", family.glob(job_id=job_id, part="meta"), "status")
    return status not in (b"queued", b"running")
