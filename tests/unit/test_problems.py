"""Refused input in plain words (webctx/problems.py): one sentence per problem, both ends
of a range where the schema has them, no pydantic wording and no documentation links."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from webctx.models import JobRequest
from webctx.problems import plain_message, plain_problems, where


class Knobs(BaseModel):
    name: str = Field(min_length=1, max_length=5)
    count: int = Field(default=1, ge=1, le=50)
    ratio: float = Field(default=0.5, gt=0, lt=1)
    tags: list[str] = Field(default_factory=list, max_length=2)
    on: bool = False


def _problems(data: dict[str, Any], model: type[BaseModel] = Knobs) -> list[str]:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(data)
    assert "errors.pydantic.dev" in str(refused.value)  # what would have been shown
    return plain_problems(refused.value.errors(), model.model_json_schema())


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({}, "name is required"),
        ({"name": ""}, "name must not be empty"),
        ({"name": "toolong"}, "name must be at most 5 characters (got 7)"),
        ({"name": "a", "count": 500}, "count must be between 1 and 50 (got 500)"),
        ({"name": "a", "count": 0}, "count must be between 1 and 50 (got 0)"),
        ({"name": "a", "count": "lots"}, "count must be a whole number (got 'lots')"),
        ({"name": "a", "count": 2.5}, "count must be a whole number (got 2.5)"),
        ({"name": "a", "ratio": 1}, "ratio must be less than 1 (got 1)"),
        ({"name": "a", "ratio": "x"}, "ratio must be a number (got 'x')"),
        ({"name": "a", "tags": ["a", "b", "c"]}, "tags must have at most 2 entries (got 3)"),
        ({"name": "a", "tags": [1]}, "tags[0] must be text (got 1)"),
        ({"name": "a", "on": "maybe"}, "on must be true or false (got 'maybe')"),
    ],
)
def test_each_kind_of_problem_reads_as_one_sentence(data: dict[str, Any], said: str) -> None:
    assert _problems(data) == [said]


def test_a_job_requests_problems_name_both_ends_of_each_range() -> None:
    problems = _problems({"question": " ", "max_sources": 500, "recency_days": 0,
                          "max_age": 10**9}, JobRequest)  # fmt: skip
    assert problems == [
        "question must contain text",
        "max_sources must be between 1 and 100 (got 500)",
        "recency_days must be between 1 and 3,650 (got 0)",  # an optional number's range too
        "max_age must be between -1 and 31,536,000 (got 1000000000)",
    ]


def test_without_a_schema_the_one_bound_known_is_named() -> None:
    with pytest.raises(ValidationError) as refused:
        Knobs.model_validate({"name": "a", "count": 500})
    assert plain_message(refused.value.errors()) == "count must be at most 50 (got 500)"


def test_locations_read_as_names_and_skip_where_a_value_came_from() -> None:
    assert where(("body", "include_domains", 3)) == "include_domains[3]"
    assert where(("query", "token_budget")) == "token_budget"
    assert where(("items", 2, "question")) == "items[2].question"
    assert where(()) == "the input"
