"""`webctx research` handed to the running local service, which submits it.

A local `webctx research` spends most of its start importing what submission needs: the
settings, the job store, redis-py and Celery (~0.3 s of 0.4 s on 2 cores; docs/benchmarks.md,
"latency"). The running service has all of that loaded. So when one runs, with the
client's settings, the command hands it the request on the service's Valkey, and the
service submits it exactly as the API does (`webctx.api.runtime.submit`: the request
limits, the local tenant's quota, the idempotency key). The command loads the job store
while the job runs, to wait for it; a request the service refuses gets the error the
command would have printed itself. Before even that, the command hands over its words as
typed (`hand_over_argv`, webctx/cli/handover.py), and the service parses them with the
command's own definition: the command then loads its parser while the job runs.

On the service's Valkey, over plain RESP (webctx/workers/resp.py: the client has not
loaded redis-py):
- the client RPUSHes one JSON item, {"request", "idempotency_key", "settings", "reply",
  "expires"} (or {"argv", "definition", "names", "settings", "reply", "expires"}), on
  `webctx:inbox` (renewing the list's TTL) and BLPOPs the item's reply key;
- the service's inbox thread BLPOPs the list, submits, and LPUSHes {"job_id"} or
  {"error", "code"} on the reply key (TTL: REPLY_TTL_S), or {"unparsed": true} for words
  it does not parse (nothing submitted);
- a client whose item was not taken within TAKE_S removes it (LREM): removed, nothing was
  submitted and it submits by itself; gone, the service holds it and answers;
- an item the service takes past its `expires` is answered {"expired": true}, not
  submitted: its client stopped waiting at that moment and submits by itself; so is one
  whose settings fingerprint is not the service's (a service restarted with other
  settings since the client looked), or one taken while a client restarts the service.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from webctx.workers.resp import RespConnection
from webctx.workers.service_client import running_service, settings_fingerprint

if TYPE_CHECKING:
    from pydantic import ValidationError

    from webctx.api.runtime import Runtime
    from webctx.settings import Settings

logger = logging.getLogger("webctx.service")

INBOX_KEY = "webctx:inbox"
REPLY_PREFIX = "webctx:inbox:reply:"
INBOX_TTL_S = 60
REPLY_TTL_S = 60
TAKE_S = 5.0
"""How long a client waits for the service to take its item before it submits by itself."""
ANSWER_S = 30.0
"""How long a client waits for the answer once the service took its item."""
POP_S = 1
"""The inbox thread's BLPOP timeout: how soon it notices the service stopping."""


def hand_over(
    data_dir: Path, request: dict[str, Any], *, idempotency_key: str | None = None,
    take_s: float = TAKE_S,
) -> dict[str, Any] | None:  # fmt: skip
    """The service's answer to `request` ({"job_id"} or {"error", "code"}), or None when no
    service with an inbox runs for `data_dir` with this process's settings, or it did not
    take the request in `take_s` (then nothing was submitted)."""
    return _hand(data_dir, {"request": request, "idempotency_key": idempotency_key}, take_s)


def hand_over_argv(
    data_dir: Path,
    argv: list[str],
    *,
    definition: str,
    names: list[str] | None = None,
    take_s: float = TAKE_S,
) -> dict[str, Any] | None:
    """Hand the service a `webctx research` command line as typed, before this process has
    loaded the command line's parser (typer and pydantic, ~0.1 s): the service parses it
    with the same command's definition (`definition`: which file defined it, and its
    version) and submits it. Its answer as `hand_over`'s, or {"unparsed": true} when it
    did not parse it (another definition, a usage error: nothing was submitted, the
    command parses and says why). `names`: this process's WEBCTX_ variables' names; the
    answer's "warnings" say which set nothing (the settings that know them are loaded
    there, not here)."""
    return _hand(data_dir, {"argv": argv, "definition": definition, "names": names}, take_s)


def _hand(data_dir: Path, fields: dict[str, Any], take_s: float) -> dict[str, Any] | None:
    info = running_service(data_dir)
    if info is None or info.inbox != INBOX_KEY:
        return None
    fingerprint = settings_fingerprint(dict(os.environ))
    if info.settings != fingerprint:
        return None  # it would submit under other settings: the command submits itself
    reply = f"{REPLY_PREFIX}{uuid.uuid4().hex}"
    # The fingerprint goes along: a service restarted meanwhile with other settings leaves
    # the item to its client.
    item = json.dumps({**fields, "settings": fingerprint, "reply": reply,
                       "expires": time.time() + take_s})  # fmt: skip
    try:
        answer = _exchange(info.socket, item, reply, take_s)
    except KeyboardInterrupt:
        return _interrupted(info.socket, item, reply)
    except OSError as exc:  # the service went away: the command submits by itself
        logger.debug("inbox unreachable", extra={"error": str(exc)})
        return None
    if answer is None:
        return None
    assert isinstance(answer, list) and isinstance(answer[1], bytes)
    found: dict[str, Any] = json.loads(answer[1])
    return None if found.get("expired") else found


def _exchange(socket: str, item: str, reply: str, take_s: float) -> object:
    """Push `item`, wait for its reply (None: not taken in `take_s`, and taken back)."""
    with RespConnection(socket) as conn:
        conn.call("RPUSH", INBOX_KEY, item)
        conn.call("EXPIRE", INBOX_KEY, INBOX_TTL_S)
        answer = conn.call("BLPOP", reply, take_s, timeout_s=take_s + 5)
        if answer is None and conn.call("LREM", INBOX_KEY, 1, item) == 0:
            # Taken meanwhile: the service is submitting it.
            answer = conn.call("BLPOP", reply, ANSWER_S, timeout_s=ANSWER_S + 5)
            if answer is None:
                late = f"the local service took the request but did not answer in {ANSWER_S:g} s"
                return [b"", json.dumps({"error": late, "code": 1}).encode()]
        return answer


def _interrupted(socket: str, item: str, reply: str) -> dict[str, Any]:
    """Ctrl-C while the service had the request: KeyboardInterrupt again when it had not
    taken it yet (taken back: nothing was submitted), else its answer marked
    `interrupted`, so that the command cancels the job it names."""
    with RespConnection(socket) as conn:
        if conn.call("LREM", INBOX_KEY, 1, item) == 1:
            raise KeyboardInterrupt
        answer = conn.call("BLPOP", reply, ANSWER_S, timeout_s=ANSWER_S + 5)
    reply_value = answer[1] if isinstance(answer, list) else None
    found = json.loads(reply_value) if isinstance(reply_value, bytes) else {}
    return {**found, "interrupted": True}


def validation_problems(exc: ValidationError) -> str:
    """A refused request's problems in plain words (`max_sources must be between 1 and
    100 (got 500); ...`), as every way in says them (webctx/problems.py)."""
    from webctx.models import JobRequest
    from webctx.problems import plain_message

    return plain_message(exc.errors(), JobRequest.model_json_schema())


@dataclass(frozen=True)
class CommandLines:
    """How the service reads a handed `webctx research` command line (the command line
    layer's): `parse` (the command line, the client's definition) -> (the request, the
    idempotency key), or None when it does not parse here; `warm` loads what parsing
    needs (~80 ms the first time) when no task runs, True once it did: asked each time
    the inbox has been idle for POP_S, until then; `warnings` (the client's WEBCTX_
    variables' names) -> the lines the command would print about names that set nothing
    (the service reads the same config file: the settings' fingerprints are equal)."""

    parse: Callable[[Any, Any], tuple[dict[str, Any], str | None] | None]
    warm: Callable[[], bool]
    warnings: Callable[[list[str]], list[str]] | None = None


def serve_inbox(
    settings: Settings,
    socket: str,
    stop: threading.Event,
    *,
    command_lines: CommandLines | None = None,
) -> None:
    """The service's inbox thread: take handed requests (and command lines, with
    `command_lines`) and answer them until `stop`."""
    from webctx.api.runtime import open_runtime

    warm = command_lines.warm if command_lines is not None else None
    own = settings_fingerprint(dict(os.environ))
    with open_runtime(settings) as runtime:
        while not stop.is_set():
            try:
                with RespConnection(socket) as conn:
                    conn.call("CLIENT", "SETNAME", "inbox")
                    while not stop.is_set():
                        popped = conn.call("BLPOP", INBOX_KEY, POP_S, timeout_s=POP_S + 10)
                        if isinstance(popped, list) and isinstance(popped[1], bytes):
                            _answer(conn, runtime, popped[1], command_lines, own)
                        elif warm is not None and warm():  # not while a job runs
                            warm = None
            except OSError:  # Valkey restarting or gone: the service ends or it comes back
                logger.warning("inbox: the service's Valkey is unreachable", exc_info=True)
                stop.wait(1.0)


def _answer(
    conn: RespConnection,
    runtime: Runtime,
    raw: bytes,
    command_lines: CommandLines | None,
    fingerprint: str,
) -> None:
    try:
        item = json.loads(raw)
        reply = str(item["reply"])
        if not reply.startswith(REPLY_PREFIX):
            raise ValueError(f"reply key {reply[:80]!r}")
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("inbox: malformed item dropped", extra={"error": str(exc)})
        return
    if float(item.get("expires") or 0) < time.time():
        # Its client has stopped waiting: it submits by itself, once it reads this.
        logger.info("inbox: a request taken too late was left to its client")
        answer: dict[str, Any] = {"expired": True}
    elif item.get("settings", fingerprint) != fingerprint:
        # Handed to the service this one replaced, with the client's settings: the
        # client submits by itself, comparing its settings with this service's.
        logger.info("inbox: a request for other settings was left to its client")
        answer = {"expired": True}
    elif "argv" in item:
        parsed = None
        if command_lines is not None:
            parsed = command_lines.parse(item["argv"], item.get("definition"))
        answer = {"unparsed": True} if parsed is None else submit_handed(runtime, *parsed)
        names = item.get("names")
        if "job_id" in answer and command_lines and command_lines.warnings and names:
            answer["warnings"] = command_lines.warnings([str(n) for n in names])
    else:
        answer = submit_handed(runtime, item.get("request"), item.get("idempotency_key"))
    conn.call("LPUSH", reply, json.dumps(answer))
    conn.call("EXPIRE", reply, REPLY_TTL_S)


def submit_handed(runtime: Runtime, request: Any, idempotency_key: Any) -> dict[str, Any]:
    """Submit a handed request as the command would have; its answer for the client."""
    import redis
    from kombu.exceptions import OperationalError
    from pydantic import ValidationError

    from webctx.api.runtime import Caller, submit
    from webctx.errors import WebctxError
    from webctx.models import JobRequest
    from webctx.workers.service_settings import ServiceRestarting

    try:
        job_request = JobRequest.model_validate(request)
    except ValidationError as exc:
        return {"error": f"invalid request: {validation_problems(exc)}", "code": 2}
    key = idempotency_key if isinstance(idempotency_key, str) else None
    try:
        caller = Caller(tenant=runtime.settings.local_tenant)
        job_id, _ = submit(runtime, caller, job_request, idempotency_key=key)
    except ServiceRestarting:  # with other settings, for a client: its client submits
        return {"expired": True}
    except WebctxError as exc:
        return {"error": str(exc), "code": 1}
    except (redis.RedisError, OperationalError) as exc:
        return {"error": f"broker or job state store unreachable: {exc}", "code": 1}
    except Exception as exc:  # noqa: BLE001 - the client must hear of it, not wait
        logger.exception("inbox: submission failed")
        return {"error": f"the local service could not submit: {type(exc).__name__}: {exc}",
                "code": 1}  # fmt: skip
    return {"job_id": job_id}
