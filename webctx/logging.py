"""Log configuration for entry points: JSON lines (or plain text) with job/task correlation.

Library code only does `logging.getLogger(__name__)` and logs constant messages with facts
as `extra` fields (STYLE §8). Entry points call `configure_logging`; the worker layer sets
the current job and task with `bind_context` (from Celery's task_prerun), and every line
logged while that task runs carries `job_id` and `task_id`, whether it passed them or not.
"""

from __future__ import annotations

import json as _json
import logging
import sys
import time
from contextvars import ContextVar
from typing import IO

_job_id: ContextVar[str | None] = ContextVar("webctx_job_id", default=None)
_task_id: ContextVar[str | None] = ContextVar("webctx_task_id", default=None)

# Attributes every LogRecord has: anything else on a record came from `extra`.
_RECORD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}
_MARK = "_webctx_handler"


def bind_context(*, job_id: str | None, task_id: str | None) -> None:
    """Correlate the lines this thread (or greenlet) logs from now on with a job and task."""
    _job_id.set(job_id)
    _task_id.set(task_id)


def clear_context() -> None:
    """Stop correlating this thread's lines (the task ended)."""
    bind_context(job_id=None, task_id=None)


class CorrelationFilter(logging.Filter):
    """Adds the bound `job_id`/`task_id` to records that do not carry their own."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in (("job_id", _job_id), ("task_id", _task_id)):
            value = var.get()
            if value is not None and getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, every `extra` field, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(
    *, json: bool = True, level: str | int = "INFO", stream: IO[str] | None = None
) -> logging.Handler:
    """Send every logger's records to `stream` (stderr) as JSON lines, or plain text.

    Idempotent: a handler installed by an earlier call is replaced, others are left alone.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    if json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.addFilter(CorrelationFilter())
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
