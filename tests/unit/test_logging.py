"""JSON log lines: constant message, facts as fields, job/task correlation from context."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from webctx.logging import bind_context, clear_context, configure_logging


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging(json=True, level="DEBUG", stream=stream)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)
    clear_context()


def test_json_lines_carry_extra_fields_and_the_bound_job(json_log: io.StringIO) -> None:
    log = logging.getLogger("webctx.test")
    log.info("page fetched", extra={"url": "https://example.org/", "status": 200})
    bind_context(job_id="job1", task_id="task1")
    log.warning("source failed", extra={"stage": "fetch"})
    log.info("own job wins", extra={"job_id": "job2"})
    clear_context()
    log.info("after the task")
    first, second, third, fourth = (json.loads(x) for x in json_log.getvalue().splitlines())
    assert first["msg"] == "page fetched" and first["status"] == 200 and "job_id" not in first
    assert first["level"] == "info" and first["logger"] == "webctx.test"
    assert second == {**second, "job_id": "job1", "task_id": "task1", "stage": "fetch"}
    assert third["job_id"] == "job2" and third["task_id"] == "task1"
    assert "job_id" not in fourth and "task_id" not in fourth


def test_configure_logging_twice_keeps_one_handler(json_log: io.StringIO) -> None:
    handler = configure_logging(json=False, level="INFO", stream=json_log)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_webctx_handler", False)]
    assert ours == [handler]
    logging.getLogger("webctx.test").info("plain")
    assert json_log.getvalue().rstrip().endswith("INFO webctx.test plain")


def test_exceptions_are_one_json_field(json_log: io.StringIO) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("webctx.test").exception("embed failed", extra={"job_id": "j"})
    line = json.loads(json_log.getvalue())
    assert line["msg"] == "embed failed" and "ValueError: boom" in line["exc"]
