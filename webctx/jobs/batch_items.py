"""A batch's input: JSONL lines validated into items, their digest, and the job each runs as.

Item `i` of batch `<batch_id>` runs as the ordinary job `<batch_id>-<i>`: the name is
deterministic (feeding an item twice cannot fork it), and a job id says which batch, if
any, it belongs to (`batch_of_job`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from webctx.errors import InvalidBatch
from webctx.models import JobRequest
from webctx.problems import plain_problems

MAX_LINE_ERRORS = 20
"""An invalid file's error names at most this many lines (and counts the rest)."""
NESTED_TOO_DEEPLY = "not JSON (nested too deeply)"


@dataclass(frozen=True)
class BatchItem:
    """One input line: the caller's id and the job request it becomes."""

    id: str
    request: JobRequest


def _error_line(number: int, message: str) -> str:
    return f"line {number}: {message}"


def parse_items(
    lines: Sequence[str], *, token_budget: int | None = None, max_sources: int | None = None
) -> list[BatchItem]:
    """Validate JSONL lines (blank lines skipped) into items; InvalidBatch names bad lines."""
    items: list[BatchItem] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        item, problem = _parse_line(line, token_budget=token_budget, max_sources=max_sources)
        if problem is None and item is not None and item.id in seen:
            problem = f"duplicate id {item.id!r} (first on line {seen[item.id]})"
        if problem is not None:
            errors.append(_error_line(number, problem))
            continue
        assert item is not None
        seen[item.id] = number
        items.append(item)
    if errors:
        more = (
            f" (and {len(errors) - MAX_LINE_ERRORS} more)" if len(errors) > MAX_LINE_ERRORS else ""
        )
        raise InvalidBatch("invalid batch: " + "; ".join(errors[:MAX_LINE_ERRORS]) + more)
    if not items:
        raise InvalidBatch("invalid batch: no items")
    return items


def json_list_lines(text: str) -> list[str]:
    """The items of a JSON list body, each as one JSON line (item N becomes line N), so
    an item nested past the decoder's depth limit is named like a bad JSONL line."""
    decoder = json.JSONDecoder()
    lines: list[str] = []
    pos = _skip_space(text, 0)
    if not text.startswith("[", pos):
        raise InvalidBatch("invalid batch: a JSON body must be a list of items")
    pos = _skip_space(text, pos + 1)
    if text.startswith("]", pos):
        return _end_of_list(text, pos, lines)
    while True:
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise InvalidBatch(f"invalid batch: body is not JSON ({exc.msg})") from exc
        except RecursionError as exc:
            number = len(lines) + 1
            raise InvalidBatch("invalid batch: " + _error_line(number, NESTED_TOO_DEEPLY)) from exc
        lines.append(json.dumps(item))
        pos = _skip_space(text, pos)
        if text.startswith("]", pos):
            return _end_of_list(text, pos, lines)
        if not text.startswith(",", pos):
            raise InvalidBatch("invalid batch: body is not JSON (expecting ',' delimiter)")
        pos = _skip_space(text, pos + 1)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _end_of_list(text: str, pos: int, lines: list[str]) -> list[str]:
    if _skip_space(text, pos + 1) != len(text):
        raise InvalidBatch("invalid batch: body is not JSON (extra data)")
    return lines


def _parse_line(
    line: str, *, token_budget: int | None, max_sources: int | None
) -> tuple[BatchItem | None, str | None]:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg})"
    except RecursionError:  # the decoder's depth limit: a hostile line, not a crash
        return None, NESTED_TOO_DEEPLY
    return parse_item(raw, token_budget=token_budget, max_sources=max_sources)


ITEM_FIELDS = frozenset(JobRequest.model_fields)
"""An item names its `id` and any field of a job request: every knob of a job."""


def parse_item(
    raw: object, *, token_budget: int | None = None, max_sources: int | None = None
) -> tuple[BatchItem | None, str | None]:
    """One decoded item, or the reason it is refused."""
    if not isinstance(raw, dict):
        return None, "not a JSON object"
    item_id = raw.get("id")
    if not isinstance(item_id, str | int) or isinstance(item_id, bool) or str(item_id) == "":
        return None, "missing id"
    question = raw.get("question")
    if not isinstance(question, str) or not question.strip():
        return None, f"empty question (id {item_id!r})"
    fields: dict[str, Any] = {"question": question}
    for name, default in (("token_budget", token_budget), ("max_sources", max_sources)):
        value = raw.get(name, default)
        if value is not None:
            fields[name] = value
    for name in ITEM_FIELDS - {"question", "token_budget", "max_sources"}:
        if name in raw:
            fields[name] = raw[name]
    unknown = set(raw) - ITEM_FIELDS - {"id"}
    if unknown:
        return None, f"unknown field(s) {sorted(unknown)} (id {item_id!r})"
    try:
        request = JobRequest.model_validate(fields)
    except ValidationError as exc:
        problems = ", ".join(plain_problems(exc.errors(), _request_schema()))
        return None, f"{problems} (id {item_id!r})"
    return BatchItem(id=str(item_id), request=request), None


@functools.cache
def _request_schema() -> dict[str, Any]:
    return JobRequest.model_json_schema()


_LATER_FIELDS: dict[str, object] = {"max_age": None, "stale_if_error": False, "depth": "fast"}
"""Request fields added after batches were first digested, with their defaults."""


def items_sha(items: Sequence[BatchItem]) -> str:
    """A digest of the items as they will run: same file and options, same digest."""
    digest = hashlib.sha256()
    for item in items:
        fields = item.request.model_dump()
        for name, default in _LATER_FIELDS.items():  # absent when unused: digests made
            if fields[name] == default:  # before these fields existed stay the same
                del fields[name]
        digest.update(json.dumps([item.id, fields], sort_keys=True).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def item_job_id(batch_id: str, index: int) -> str:
    """The job id of item `index` (deterministic: feeding twice cannot fork an item)."""
    return f"{batch_id}-{index}"


def batch_of_job(job_id: str) -> str | None:
    """The batch id a batch item's job id names, or None for an interactive job."""
    batch_id, sep, index = job_id.rpartition("-")
    return batch_id if sep and index.isdigit() and len(batch_id) == 32 else None
