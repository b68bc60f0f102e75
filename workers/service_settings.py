"""A job runs under its caller's settings: the local service's settings against a client's.

The local service of a data directory runs with the settings of whoever started it (its
environment, and the config file, webctx/config_file.py). A client with other settings
(an MCP host started with a minimal environment, a terminal with WEBCTX_SEARXNG_URL
exported, a config file changed since) would otherwise have its job searched, fetched
and embedded as it did not ask. So before a client hands the service work (a job, a
batch, a re-index run, an index search), `ensure_service_for` compares the settings a
job's result depends on (all but `NOT_COMPARED` of webctx/workers/service_client.py):

- the same: the work goes to the running service;
- different and the service idle (no message queued or held but its own housekeeping):
  the service is restarted with the client's settings, said in one line;
- different and the service busy: refused (`SettingsMismatch`), naming the settings
  that differ (names only: values may be keys) and the ways out.

The service records a salted digest of each value in its address file (`service_record`),
so a client learns which settings differ without any value being written down.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import logging
import secrets
from collections.abc import Mapping
from typing import cast

from pydantic import SecretStr
from pydantic_core import to_jsonable_python

from webctx.env_names import setting_names
from webctx.errors import SettingsMismatch
from webctx.settings import Settings
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
HOUSEKEEPING = frozenset({"webctx.index.tick"})
"""Tasks the service sends itself on a schedule: not a caller's work."""


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


def ensure_service_for(settings: Settings) -> ServiceInfo | None:
    """The local service, running with `settings` (restarted with them when it was idle
    with others); None with a broker, or inside the service. SettingsMismatch when it runs
    others and is busy."""
    if not settings.embedded or in_service_process():
        return None
    data_dir = settings.data_dir
    info = ensure_service(data_dir)
    if not differing(info, settings):
        return info
    with (data_dir / RESTART_LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another client may be restarting it right now
        info = ensure_service(data_dir)
        names = differing(info, settings)
        if not names:
            return info
        if busy(info):
            raise SettingsMismatch(names, pid=info.pid)
        old = info.pid
        stop_service(data_dir)
        info = ensure_service(data_dir)
        still = differing(info, settings)
        if still:  # it reads a config file that changed since this client read it
            raise SettingsMismatch(still, pid=info.pid, restarted=True)
    logger.warning("restarted the local service (pid %s, now %s) with this client's settings: "
                   "%s differed", old, info.pid, ", ".join(names))  # fmt: skip
    return info


def busy(info: ServiceInfo) -> bool:
    """True if the service has a message queued, or one held (running, or due later),
    besides its own housekeeping and the deadline watchdogs of ended jobs."""
    lists = _queue_lists()
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


def _queue_lists() -> list[str]:
    """Every list of the service's queues (one per priority step)."""
    from webctx.workers import celeryconfig
    from webctx.workers.service import PRIORITY_SEP

    steps = cast(list[int], celeryconfig.broker_transport_options["priority_steps"])
    names = [q.name for q in celeryconfig.task_queues]
    return [n if step == 0 else f"{n}{PRIORITY_SEP}{step}" for n in names for step in steps]


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
    status = conn.call("HGET", f"webctx:job:{job_id}:meta", "status")
    return status not in (b"queued", b"running")
