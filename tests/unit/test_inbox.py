"""`webctx research` handed to a running local service (webctx/api/inbox.py), the client's
side: a real Valkey of the data directory, a service.json naming it, and this test in the
service's place (it answers, late, or not at all)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import ROOT, as_at_a_terminal
from webctx.api.inbox import INBOX_KEY, REPLY_PREFIX, _answer, hand_over
from webctx.cli.handover import definition
from webctx.jobs.store import JobStore
from webctx.models import JobRequest, JobStatus
from webctx.workers.resp import RespConnection, RespError
from webctx.workers.service_client import ADDRESS_FILE, LOCK_FILE, settings_fingerprint
from webctx.workers.state_server import state_server_url

REQUEST = {"question": "why is the sky blue?", "max_sources": 3}


@pytest.fixture
def valkey(data_dir: Path) -> Iterator[str]:
    """The socket of a real Valkey for `data_dir`, and a service.json naming it (with an
    inbox, this process's pid and settings), its lock held: a running service as a client
    sees one, with nobody serving its inbox yet."""
    data_dir.mkdir(parents=True, exist_ok=True)
    socket = state_server_url(data_dir).removeprefix("unix://").split("?")[0]
    lock = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    _address(data_dir, socket, inbox=INBOX_KEY)
    yield socket
    os.close(lock)


def _address(data_dir: Path, socket: str, **extra: Any) -> None:
    info = {"pid": os.getpid(), "socket": socket,
            "settings": settings_fingerprint(dict(os.environ)), **extra}  # fmt: skip
    (data_dir / ADDRESS_FILE).write_text(json.dumps(info))


def _serve(
    socket: str,
    *answers: dict[str, Any],
    on_take: Callable[[dict[str, Any]], None] = lambda item: None,
) -> threading.Thread:
    """Play the service: take one item per answer, record it, call `on_take` (its client
    waits for the reply meanwhile), answer it in turn."""

    def run() -> None:
        with RespConnection(socket) as conn:
            for answer in answers:
                popped = conn.call("BLPOP", INBOX_KEY, 10, timeout_s=20)
                assert isinstance(popped, list) and isinstance(popped[1], bytes)
                taken.append(json.loads(popped[1]))
                on_take(taken[-1])
                conn.call("LPUSH", taken[-1]["reply"], json.dumps(answer))

    taken: list[dict[str, Any]] = []
    thread = threading.Thread(target=run, daemon=True)
    thread.taken = taken  # type: ignore[attr-defined]
    thread.start()
    return thread


def _research(service: threading.Thread, *words: str, importtime: bool = False,
              stderr: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`webctx research WORDS` in a new interpreter, then the fake service's end."""
    flags = ["-X", "importtime"] if importtime else []
    done = subprocess.run([sys.executable, *flags, "-m", "webctx.cli", "research", *words],
                          cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE,
                          stderr=stderr, text=True, timeout=60)  # fmt: skip
    service.join(5)
    return done


def test_resp_speaks_every_reply_kind_and_raises_server_errors(valkey: str) -> None:
    with RespConnection(valkey) as conn:
        assert conn.call("PING") == b"PONG"
        assert conn.call("RPUSH", "l", b"a\r\nb", "") == 2  # CRLF inside a bulk string
        assert conn.call("LRANGE", "l", 0, -1) == [b"a\r\nb", b""]
        assert conn.call("GET", "missing") is None
        assert conn.call("BLPOP", "empty", 0.05) is None  # a nil array
        with pytest.raises(RespError, match="wrong number of arguments"):
            conn.call("GET")
        assert conn.call("SET", "big", b"x" * 300_000) == b"OK"
        assert conn.call("STRLEN", "big") == 300_000 and len(conn.call("GET", "big")) == 300_000  # type: ignore[arg-type]


def test_a_request_the_service_takes_is_answered_with_its_job_id(
    data_dir: Path, valkey: str
) -> None:
    service = _serve(valkey, {"job_id": "job-1"})
    answer = hand_over(data_dir, REQUEST, idempotency_key="k-1")
    service.join(5)
    assert answer == {"job_id": "job-1"}
    (item,) = service.taken  # type: ignore[attr-defined]
    assert item["request"] == REQUEST and item["idempotency_key"] == "k-1"
    assert item["reply"].startswith(REPLY_PREFIX) and item["expires"] > time.time()
    # The inbox and the reply key expire: nothing stays behind a client that went away.
    client = redis.Redis(unix_socket_path=valkey)
    assert client.ttl(INBOX_KEY) in (-2, *range(1, 61))


def test_a_request_nobody_takes_is_withdrawn_and_left_to_the_command(
    data_dir: Path, valkey: str
) -> None:
    started = time.monotonic()
    assert hand_over(data_dir, REQUEST, take_s=0.3) is None
    assert time.monotonic() - started < 3
    assert redis.Redis(unix_socket_path=valkey).llen(INBOX_KEY) == 0  # nothing to submit later


def test_a_request_taken_too_late_is_answered_expired_and_never_submitted(
    data_dir: Path, valkey: str
) -> None:
    # The service takes the item just after its client stopped waiting (0.3 s), and finds
    # it expired: it answers so without submitting, and the client submits by itself.
    submitted: list[object] = []

    class Runtime:  # what _answer would submit through: must not be reached
        def __getattr__(self, name: str) -> object:
            submitted.append(name)
            raise AssertionError(name)

    def late_service() -> None:
        with RespConnection(valkey) as conn:
            popped = conn.call("BLPOP", INBOX_KEY, 10, timeout_s=20)
            assert isinstance(popped, list) and isinstance(popped[1], bytes)
            time.sleep(0.5)
            _answer(conn, Runtime(), popped[1], None, fingerprint)  # type: ignore[arg-type]

    fingerprint = settings_fingerprint(dict(os.environ))
    thread = threading.Thread(target=late_service, daemon=True)
    thread.start()
    assert hand_over(data_dir, REQUEST, take_s=0.3) is None
    thread.join(5)
    assert submitted == []


def test_a_request_for_other_settings_than_the_services_is_left_to_its_client(
    data_dir: Path, valkey: str
) -> None:
    # The client read the address of a service that another client has since replaced
    # with one of other settings: the new service must not submit it under its own.
    class Runtime:  # what _answer would submit through: must not be reached
        def __getattr__(self, name: str) -> object:
            raise AssertionError(name)

    def replaced_service() -> None:
        with RespConnection(valkey) as conn:
            popped = conn.call("BLPOP", INBOX_KEY, 10, timeout_s=20)
            assert isinstance(popped, list) and isinstance(popped[1], bytes)
            _answer(conn, Runtime(), popped[1], None, "another-fingerprint")  # type: ignore[arg-type]

    thread = threading.Thread(target=replaced_service, daemon=True)
    thread.start()
    assert hand_over(data_dir, REQUEST, take_s=5) is None  # the command submits itself
    thread.join(5)


def test_no_hand_over_to_a_service_without_an_inbox_or_with_other_settings(
    data_dir: Path, valkey: str
) -> None:
    _address(data_dir, valkey)  # a service of an earlier version: no inbox
    assert hand_over(data_dir, REQUEST, take_s=5) is None
    _address(data_dir, valkey, inbox=INBOX_KEY, settings="0123456789abcdef")
    assert hand_over(data_dir, REQUEST, take_s=5) is None
    assert redis.Redis(unix_socket_path=valkey).llen(INBOX_KEY) == 0


def test_research_hands_over_before_loading_redis_celery_or_the_settings(
    data_dir: Path, valkey: str
) -> None:
    done = _research(_serve(valkey, {"job_id": "job-7"}), "why?", "--no-wait", importtime=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "job-7"
    loaded = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
              if line.startswith("import time:")}  # fmt: skip
    # (pydantic itself is loaded by typer as it builds the command.)
    heavy = {"redis", "celery", "kombu", "pydantic_settings", "webctx.settings",
             "webctx.models", "webctx.jobs.store", "webctx.api.runtime"}  # fmt: skip
    assert loaded and heavy & loaded == set()


def test_research_hands_over_its_words_before_its_command_line_parser_loads(
    data_dir: Path, valkey: str, tmp_path: Path
) -> None:
    imports = tmp_path / "imports.txt"
    loaded_at_take: list[set[str]] = []

    def on_take(item: dict[str, Any]) -> None:  # the client waits on its reply meanwhile
        loaded_at_take.append({line.split("|")[-1].strip()
                               for line in imports.read_text().splitlines()})  # fmt: skip

    service = _serve(valkey, {"job_id": "job-9"}, on_take=on_take)
    argv = ["why?", "--max-sources", "3", "--no-wait", "--include-domain", "a.org"]
    with imports.open("w") as err:
        done = _research(service, *argv, importtime=True, stderr=err)
    assert done.returncode == 0, imports.read_text()[-3000:]
    assert done.stdout.strip() == "job-9"  # parsed afterwards: --no-wait holds
    (item,) = service.taken  # type: ignore[attr-defined]
    assert item["argv"] == argv and item["definition"] == definition()
    (loaded,) = loaded_at_take
    assert "webctx.api.inbox" in loaded
    assert {"typer", "pydantic", "webctx.cli.jobs"} & loaded == set()


def test_words_the_service_does_not_parse_are_parsed_and_handed_over_by_the_command(
    data_dir: Path, valkey: str
) -> None:
    service = _serve(valkey, {"unparsed": True}, {"job_id": "job-8"})
    done = _research(service, "why?", "--top-k", "7", "--no-wait")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "job-8"
    words, parsed = service.taken  # type: ignore[attr-defined]
    assert "argv" in words and parsed["request"]["top_k"] == 7


def test_a_refused_request_gets_the_services_error_and_exit_code(
    data_dir: Path, valkey: str
) -> None:
    service = _serve(valkey, {"error": "invalid request: max_sources: too many", "code": 2})
    done = _research(service, "why?")
    assert done.returncode == 2
    assert done.stderr.strip().endswith("error: invalid request: max_sources: too many")


def _research_process(*words: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "webctx.cli", "research", *words],
                            cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_at_a_terminal)  # fmt: skip


def test_a_ctrl_c_before_the_service_takes_the_request_withdraws_it(
    data_dir: Path, valkey: str
) -> None:
    client = redis.Redis(unix_socket_path=valkey)
    research = _research_process("why?")  # nobody serves the inbox: the item waits there
    deadline = time.monotonic() + 30
    while client.llen(INBOX_KEY) == 0:
        assert time.monotonic() < deadline and research.poll() is None
        time.sleep(0.01)
    research.send_signal(signal.SIGINT)
    _, err = research.communicate(timeout=30)
    assert research.returncode == 130
    assert err.strip() == "interrupted: no job was submitted"
    assert client.llen(INBOX_KEY) == 0  # withdrawn: nothing is submitted later


def test_a_ctrl_c_while_the_service_submits_cancels_the_job_it_names(
    data_dir: Path, valkey: str
) -> None:
    jobs = JobStore(redis.Redis(unix_socket_path=valkey, decode_responses=True))
    job_id = jobs.create(JobRequest(question="why?"), tenant="local")
    running: list[subprocess.Popen[str]] = []

    def interrupt_it(item: dict[str, Any]) -> None:  # it waits for the job id meanwhile
        running[0].send_signal(signal.SIGINT)
        time.sleep(0.3)

    service = _serve(valkey, {"job_id": job_id}, on_take=interrupt_it)
    running.append(_research_process("why?"))
    _, err = running[0].communicate(timeout=60)
    service.join(5)
    assert running[0].returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == f"cancelled job {job_id}"
    assert jobs.status(job_id) is JobStatus.CANCELLED


def test_a_handed_research_prints_the_services_warnings_about_its_variables_names(
    data_dir: Path, valkey: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Names only go to the service (which has the settings loaded), never the values.
    monkeypatch.setenv("WEBCTX_SEARXNG_ULR", "http://127.0.0.1:9/secret-path")
    _address(data_dir, valkey, inbox=INBOX_KEY)  # the fingerprint of this environment
    warning = "warning: WEBCTX_SEARXNG_ULR is not a webctx setting (ignored)"
    service = _serve(valkey, {"job_id": "job-8", "warnings": [warning]})
    done = _research(service, "why?", "--no-wait")
    assert done.returncode == 0 and done.stdout.strip() == "job-8", done.stderr
    assert done.stderr.splitlines() == [warning]  # said once: the command does not again
    (item,) = service.taken  # type: ignore[attr-defined]
    assert "WEBCTX_SEARXNG_ULR" in item["names"] and "secret-path" not in json.dumps(item)


def test_the_service_names_the_variables_that_set_nothing() -> None:
    from webctx.cli.config import names_warnings

    assert names_warnings(["WEBCTX_SEARXNG_URL", "WEBCTX_FETCH__MAX_BYTE", "WEBCTX_TEST_X"]) == [
        "warning: WEBCTX_FETCH__MAX_BYTE is not a webctx setting (ignored); "
        "did you mean WEBCTX_FETCH__MAX_BYTES?"
    ]
