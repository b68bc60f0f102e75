"""Refused input in plain words: pydantic's validation errors as one sentence each, the
same on every surface (`webctx research`, the HTTP API's 422, the MCP tools, batch lines).

    max_sources must be between 1 and 100 (got 500)
    top_k must be a whole number (got 'abc')
    question is required

pydantic's own text (`Input should be less than or equal to 100 [type=less_than_equal,
input_value=500, ...] For further information visit https://errors.pydantic.dev/...`) is
written for the programmer of the model, not for whoever typed the value. Where both
bounds of a number are known (a JSON schema's `minimum` and `maximum`), both are named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_SKIPPED = frozenset({"body", "query", "path", "header"})
"""FastAPI's first location part: where a value came from, not its name."""
_KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false",
          "string": "text", "list": "a list", "dict": "an object",
          "date": "a date (YYYY-MM-DD)", "datetime": "a date and time (ISO 8601)"}  # fmt: skip


def plain_problems(
    errors: Iterable[Mapping[str, Any]], schema: Mapping[str, Any] | None = None
) -> list[str]:
    """One sentence per error of `ValidationError.errors()` (or FastAPI's); `schema`, the
    model's JSON schema, supplies the other bound of a range."""
    properties = (schema or {}).get("properties", {})
    return [_sentence(error, properties) for error in errors]


def plain_message(
    errors: Iterable[Mapping[str, Any]], schema: Mapping[str, Any] | None = None
) -> str:
    """The problems joined into one message: `a must ...; b is required`."""
    return "; ".join(plain_problems(errors, schema))


def where(loc: Sequence[Any]) -> str:
    """`include_domains[2]`, `items.question`: a location as a reader names it."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (out == "" and part in _SKIPPED):
            out += f".{part}" if out else str(part)
    return out or "the input"


def _got(value: Any) -> str:
    if isinstance(value, str) and len(value) > 40:
        return f"{len(value):,} characters"
    if isinstance(value, list | dict) and len(repr(value)) > 40:
        return f"{type(value).__name__} of {len(value)}"
    return repr(value)


def _number(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:g}"
    return f"{int(value):,}" if isinstance(value, int | float) else str(value)


def _bounds(prop: Mapping[str, Any], ctx: Mapping[str, Any]) -> tuple[Any, Any]:
    """(low, high) of a number: from the error, else from the schema (None: unbounded)."""
    branches = [prop, *prop.get("anyOf", ())]  # an optional number: bounds on a branch
    low = ctx.get("ge", next((b["minimum"] for b in branches if "minimum" in b), None))
    high = ctx.get("le", next((b["maximum"] for b in branches if "maximum" in b), None))
    return low, high


def _range(name: str, low: Any, high: Any, got: str) -> str:
    if low is not None and high is not None:
        return f"{name} must be between {_number(low)} and {_number(high)} (got {got})"
    if low is not None:
        return f"{name} must be at least {_number(low)} (got {got})"
    return f"{name} must be at most {_number(high)} (got {got})"


def _sentence(error: Mapping[str, Any], properties: Mapping[str, Any]) -> str:
    loc = tuple(error.get("loc", ()))
    name = where(loc)
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    value = error.get("input")
    top = next((p for p in loc if isinstance(p, str) and p not in _SKIPPED), "")
    prop = properties.get(top, {}) if len(loc) and loc[-1] == top else {}
    if kind == "missing":
        return f"{name} is required"
    if kind == "greater_than":
        return f"{name} must be more than {_number(ctx.get('gt'))} (got {_got(value)})"
    if kind == "less_than":
        return f"{name} must be less than {_number(ctx.get('lt'))} (got {_got(value)})"
    if kind in ("greater_than_equal", "less_than_equal"):
        return _range(name, *_bounds(prop, ctx), _got(value))
    if kind == "string_too_short":
        if ctx.get("min_length") == 1:
            return f"{name} must not be empty"
        return (
            f"{name} must be at least {ctx.get('min_length')} characters (got {len(value or '')})"
        )
    if kind == "string_too_long":
        most, got = ctx.get("max_length", 0), len(value or "")
        return f"{name} must be at most {most:,} characters (got {got:,})"
    if kind in ("too_long", "too_short"):
        bound = ctx.get("max_length") if kind == "too_long" else ctx.get("min_length")
        most = "most" if kind == "too_long" else "least"
        return f"{name} must have at {most} {bound} entries (got {ctx.get('actual_length', '?')})"
    if kind == "extra_forbidden":
        return f"{name} is not an accepted field"
    if kind in ("literal_error", "enum"):
        return f"{name} must be one of {ctx.get('expected', '?')} (got {_got(value)})"
    if kind == "json_invalid":
        return f"the input is not valid JSON ({ctx.get('error', 'unreadable')})"
    if kind == "value_error":  # a validator's own sentence; named unless it names itself
        said = str(error.get("msg", "")).removeprefix("Value error, ")
        return said if said.startswith(str(top) or "\0") else f"{name}: {said}"
    base = kind.split("_", 1)[0]
    if base in _KINDS and (kind.endswith(("_type", "_parsing")) or kind == "int_from_float"):
        return f"{name} must be {_KINDS[base]} (got {_got(value)})"
    return f"{name}: {error.get('msg', 'invalid')}"
