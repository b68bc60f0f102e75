"""The service's side of `webctx research` handed over as typed (webctx/cli/handover.py):
it reads the words as the command itself would, or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from webctx.cli.handover import definition
from webctx.cli.jobs import request_of_argv


def test_the_words_give_the_request_the_command_would_submit() -> None:
    argv = ["why is the sky blue?", "--max-sources", "20", "-f", "markdown", "--top-k", "200",
            "--include-domain", "a.org", "--include-domain", "b.org", "--max-age", "0",
            "--stale-if-error", "--idempotency-key", "k-1", "--timeout", "9",
            "--no-wait"]  # fmt: skip
    parsed = request_of_argv(argv, definition())
    assert parsed == (
        {"question": "why is the sky blue?", "max_sources": 20, "top_k": 200,
         "token_budget": 3000, "max_queries": 4, "include_domains": ["a.org", "b.org"],
         "exclude_domains": [], "recency_days": None, "max_age": 0, "stale_if_error": True,
         "depth": "fast"},
        "k-1",
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        [],  # no question
        ["why?", "--max-sources", "many"],
        ["why?", "--no-such-option"],
        ["why?", "--help"],
        ["why?", 3],  # not words
        "why?",
    ],
)
def test_words_that_do_not_parse_are_left_to_the_command(argv: object) -> None:
    assert request_of_argv(argv, definition()) is None


def test_words_of_another_definition_of_the_command_are_left_to_it(tmp_path: Path) -> None:
    other = tmp_path / "jobs.py"
    other.write_text("# another webctx's research command\n")
    assert definition(other) != definition()
    assert request_of_argv(["why?"], definition(other)) is None
    assert request_of_argv(["why?"], None) is None


def test_the_parser_is_warmed_only_while_no_task_runs() -> None:
    from celery.worker import state

    from webctx.cli.jobs import warm_research_parser

    class Request:  # what the worker holds for a running task (weakly)
        pass

    running = Request()
    state.active_requests.add(running)  # type: ignore[arg-type]
    try:
        assert warm_research_parser() is False
    finally:
        state.active_requests.discard(running)  # type: ignore[arg-type]
    assert warm_research_parser() is True
