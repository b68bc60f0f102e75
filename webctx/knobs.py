"""The one table of a research job's knobs: each one's default, range and help.

`JobRequest` (webctx/models.py) builds its fields from it, so the HTTP API's body takes
them; `webctx research` builds its options from it and the MCP `web_context` tool its
arguments. Plain Python, no pydantic: `webctx research` reads it before its request is
handed to the local service, where every millisecond of import shows in its latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_AGE_LIMIT_S = 365 * 24 * 3600
"""The largest `max_age` a request may name (one year, in seconds)."""


DEPTHS = ("fast", "deep")
"""The values of the `depth` knob: one round, or further rounds for weak facets."""


@dataclass(frozen=True)
class Knob:
    """A knob: its default, its range (inclusive; None: unbounded), its help and, for a
    knob that takes words, the words it takes."""

    default: Any
    low: int | None
    high: int | None
    help: str
    choices: tuple[str, ...] = ()


KNOBS: dict[str, Knob] = {
    "max_sources": Knob(10, 1, 100, "Pages to fetch at most."),
    # Chunks are small (64 tokens): the budget, not top_k, should bound an ordinary bundle.
    "top_k": Knob(60, 1, 200, "Passages in the bundle at most."),
    "token_budget": Knob(3000, 50, 100_000, "Tokens of passage text at most."),
    "max_queries": Knob(4, 1, 10, "Search queries planned at most."),
    "recency_days": Knob(None, 1, 3650, "Only pages published within this many days."),
    "max_age": Knob(
        None,
        -1,
        MAX_AGE_LIMIT_S,
        "Seconds: a stored copy of a page confirmed current this recently is used instead "
        "of a download. Default (null): the page-cache window (WEBCTX_PAGE_CACHE_TTL_S, "
        "24 h) for batch items and the embedded default's jobs; interactive jobs on a "
        "broker download anew. 0: every page is downloaded for this job, never a copy older "
        "than the job. -1: stored copies only, of any age; a page without one fails "
        "`not_cached`, nothing is downloaded. The configured windows cap it.",
    ),
    "depth": Knob(
        "fast",
        None,
        None,
        "`fast`: one round of search and fetch. `deep`: further rounds while a facet of "
        "the question is weak or missing: new queries (the facet alone, terms of its best "
        "passages) and same-site links of the best pages, within the deep bounds "
        "(WEBCTX_DEEP__*).",
        choices=DEPTHS,
    ),
    "stale_if_error": Knob(
        False,
        None,
        None,
        "When a page's download fails, use the newest stored copy instead (its source says "
        "`stale` and why); without it the page fails.",
    ),
}


def default(name: str) -> Any:
    """The default of knob `name`."""
    return KNOBS[name].default


def help_text(name: str) -> str:
    """The help of knob `name`, with its range when it has one: `Pages to fetch at most
    (1-100).`"""
    knob = KNOBS[name]
    if knob.choices:
        return f"{knob.help} One of: {', '.join(knob.choices)}."
    if knob.low is None or knob.high is None or name == "max_age":
        return knob.help
    return f"{knob.help.removesuffix('.')} ({knob.low:,}-{knob.high:,})."


def knobs_table() -> str:
    """The table's rows as docs/api.md shows them (one Markdown row per knob)."""
    rows = []
    for name, knob in KNOBS.items():
        if isinstance(knob.default, str):
            value = f"`{knob.default}`"
        elif isinstance(knob.default, bool) or knob.default is None:
            value = {None: "unset", True: "true", False: "false"}[knob.default]
        else:
            value = f"{knob.default:,}"
        span = "" if knob.low is None else f"{knob.low:,} to {knob.high:,}"
        span = ", ".join(f"`{c}`" for c in knob.choices) or span
        rows.append(f"| `{name}` | {value} | {span} | {knob.help} |")
    return "\n".join(rows)
