"""What a job request holds once validated, whatever way it came in: a question without
terminal control sequences or invisible characters."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from webctx.models import JobRequest, clean_text
from webctx.stages.plan import plan_queries

HOSTILE_QUESTION = (
    "\x1b]0;owned\x07how do\x1b[2J\x1b[H lithium\x00 batteries\x0c degrade?\x1bc"
    "\u202e\x9b31m\x1b]8;;http://127.0.0.2/\x1b\\ now\x1b]8;;\x1b\\\U000e0041"
)


def test_a_questions_control_sequences_and_invisible_characters_are_stripped() -> None:
    request = JobRequest(question=HOSTILE_QUESTION)
    assert request.question == "how do lithium batteries degrade? now"
    assert plan_queries(request.question, max_queries=4)
    for query in plan_queries(request.question, max_queries=4):
        assert query.isprintable()


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("tab\tnew\nline\r\n end", "tab new line end"),  # whitespace collapsed, not dropped
        ("naïve café, 日本語? ok", "naïve café, 日本語? ok"),
        ("zero\u200bwidth\ufeff and\u2066 isolate\u2069", "zerowidth and isolate"),
        ("keep\u200cnon-joiner", "keep\u200cnon-joiner"),  # Persian and Indic spelling
        ("unterminated \x1b]0;title", "unterminated 0;title"),  # shown, no longer acted on
        ("bell\x07 del\x7f nel\x85line", "bell del nel line"),
    ],
)
def test_clean_text_keeps_what_a_reader_sees(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


def test_a_question_of_control_characters_alone_is_refused() -> None:
    with pytest.raises(ValidationError, match="question must contain text"):
        JobRequest(question="\x1b[2J\x00\x07")
