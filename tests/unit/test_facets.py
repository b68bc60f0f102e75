"""Facets: the parts of a question an answer needs, split by rules."""

from __future__ import annotations

import pytest

from webctx.models import Bundle, Coverage, FacetCoverage
from webctx.stages.facets import split_facets


@pytest.mark.parametrize(
    "question",
    [
        "How long was the fault where the quake occurred?",
        "Which of Paris, London and Berlin is the largest?",
        "What is the difference between the two?",
        "salt and pepper",
        "Why?",
        "What is X? Why?",
    ],
)
def test_a_one_facet_question_is_its_only_facet(question: str) -> None:
    assert split_facets(question) == [question]


def test_whitespace_is_collapsed_in_the_one_facet() -> None:
    assert split_facets("  what   is Redis? ") == ["what is Redis?"]


def test_two_questions_asked_at_once_are_two_facets() -> None:
    assert split_facets("Who founded Acme Corp? When did the company go public?") == [
        "Who founded Acme Corp?",
        "When did the company go public?",
    ]


def test_a_question_without_its_mark_still_splits_after_one_with_it() -> None:
    assert split_facets("Where was Feynman born? how many Nobel prizes did he win") == [
        "Where was Feynman born?",
        "how many Nobel prizes did he win",
    ]


@pytest.mark.parametrize(
    ("question", "facets"),
    [
        ("Redis vs Memcached on persistence", ["Redis persistence", "Memcached persistence"]),
        ("Compare PostgreSQL and MySQL replication",
         ["PostgreSQL replication", "MySQL replication"]),
        ("What is the difference between TCP and UDP?", ["TCP", "UDP"]),
        ("iPhone 15 versus the Pixel 8 battery life",
         ["iPhone 15 battery life", "Pixel 8 battery life"]),
    ],
)  # fmt: skip
def test_a_comparison_gets_one_facet_per_compared_item(question: str, facets: list[str]) -> None:
    assert split_facets(question) == facets


def test_a_list_gets_one_facet_per_item_with_the_question_around_it() -> None:
    assert split_facets("What do cats, dogs and rabbits eat?") == [
        "What do cats eat?",
        "What do dogs eat?",
        "What do rabbits eat?",
    ]
    assert split_facets("How do I install Python, pip, and virtualenv on Windows?") == [
        "How do I install Python on Windows?",
        "How do I install pip on Windows?",
        "How do I install virtualenv on Windows?",
    ]


def test_commas_around_a_clause_are_no_list() -> None:
    question = "How does the APG system of 1998, with its 2003 and 2009 revisions, treat plants?"
    assert split_facets(question) == [question]


def test_compound_comparison_and_list_combine_in_order() -> None:
    assert split_facets(
        "Redis vs Memcached on persistence? What do cats, dogs and rabbits eat?"
    ) == [
        "Redis persistence",
        "Memcached persistence",
        "What do cats eat?",
        "What do dogs eat?",
        "What do rabbits eat?",
    ]


def test_a_repeated_question_is_one_facet() -> None:
    assert split_facets("Who wrote Hamlet? Who wrote Hamlet?") == [
        "Who wrote Hamlet? Who wrote Hamlet?"
    ]


def test_a_bundle_carries_coverage_and_reads_without_it() -> None:
    coverage = Coverage(
        sufficient=False,
        confidence=0.1,
        facets=[
            FacetCoverage(text="a", status="supported", confidence=0.9, chunks=[0]),
            FacetCoverage(text="b", status="missing", confidence=0.05, chunks=[]),
        ],
    )
    bundle = Bundle(job_id="j", question="a b", queries=[], sources=[], chunks=[],
                    coverage=coverage)  # fmt: skip
    again = Bundle.model_validate_json(bundle.model_dump_json())
    assert again.coverage == coverage
    old = Bundle.model_validate({"job_id": "j", "question": "q", "queries": [], "sources": [],
                                 "chunks": []})  # fmt: skip
    assert old.coverage is None


def test_a_confidence_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="confidence"):
        FacetCoverage(text="a", status="weak", confidence=1.5, chunks=[])


def test_two_questions_without_a_question_mark_between_split_at_the_second_question_word() -> None:
    assert split_facets("What is the name of the stadium What was the radio called?") == [
        "What is the name of the stadium",
        "What was the radio called?",
    ]


def test_a_question_mark_inside_quotes_ends_its_question() -> None:
    assert split_facets('Who was the "Mistress of the animals?" Where is Knossos located?') == [
        'Who was the "Mistress of the animals?"',
        "Where is Knossos located?",
    ]


def test_a_list_describing_the_one_thing_asked_for_is_no_facets() -> None:
    question = "Which theatre in Hanover hosts musicals, shows and guest performances?"
    assert split_facets(question) == [question]
