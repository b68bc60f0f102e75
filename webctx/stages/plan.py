"""Turn a question into search queries: rule-based by default, an LLM when configured."""

from __future__ import annotations

import itertools
import json
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from webctx.models import clean_text
from webctx.stages.facets import split_facets
from webctx.stages.words import STOPWORDS as _STOPWORDS
from webctx.stages.words import TOKEN as _TOKEN
from webctx.stages.words import keywords as _keywords

if TYPE_CHECKING:  # the client costs ~0.5 s to import: only an LLM planner needs it
    import openai

logger = logging.getLogger(__name__)

_QUOTED = re.compile(r"[\"“”]([^\"“”]{2,})[\"“”]")
_MAX_QUERY_CHARS = 200
_LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.+)$")
MAX_FACETS = 8
"""Facets a planner may give a question at most: more is no plan, and the rules split it."""
MAX_FACET_CHARS = 300
"""Characters of one facet at most (a question is a few sentences)."""


@dataclass(frozen=True)
class QueryPlan:
    """A question's search queries and its facets (the parts rank and coverage see: one,
    the question itself, unless it asks several things)."""

    queries: list[str]
    facets: list[str]


def plan_question(question: str, *, max_queries: int) -> QueryPlan:
    """The rule-based plan: `plan_queries` and `split_facets`."""
    return QueryPlan(plan_queries(question, max_queries=max_queries), split_facets(question))


def _dedupe(queries: list[str], max_queries: int) -> list[str]:
    """Drop empty and case-insensitive duplicate queries, keep order, cap the count; an
    LLM's queries lose control characters as questions do (`clean_text`)."""
    seen: set[str] = set()
    out: list[str] = []
    for query in queries:
        query = clean_text(query)[:_MAX_QUERY_CHARS]
        if query and query.casefold() not in seen:
            seen.add(query.casefold())
            out.append(query)
    return out[:max_queries]


def _is_entity(token: str, sentence_start: bool) -> bool:
    """Proper-noun-like: capitalised mid-sentence, an acronym/CamelCase, or letters+digits."""
    inner_upper = any(c.isupper() for c in token[1:])
    has_digit = any(c.isdigit() for c in token) and any(c.isalpha() for c in token)
    capitalised = token[0].isupper() and not sentence_start
    return (capitalised or inner_upper or has_digit) and token.casefold() not in _STOPWORDS


def _entities(text: str) -> list[str]:
    """Runs of adjacent entity-like tokens ("Large Hadron Collider", "Redis", "GPT-4")."""
    tokens: list[tuple[str, bool, bool]] = []  # (token, is_entity, adjacent to previous)
    prev_end = 0
    for match in _TOKEN.finditer(text):
        gap = text[prev_end : match.start()]
        sentence_start = prev_end == 0 or gap.strip() in (".", "?", "!", ":")
        tokens.append((match.group(), _is_entity(match.group(), sentence_start), gap.isspace()))
        prev_end = match.end()
    entities: list[str] = []
    run: list[str] = []
    for i, (token, is_entity, adjacent) in enumerate(tokens):
        # A capitalised first word belongs to an entity that continues ("New York").
        leads = (
            token[0].isupper()
            and token.casefold() not in _STOPWORDS
            and i + 1 < len(tokens)
            and tokens[i + 1][1]
            and tokens[i + 1][2]
        )
        if run and not ((is_entity or leads) and adjacent):
            entities.append(" ".join(run))
            run = []
        if is_entity or leads:
            run.append(token)
    return entities + ([" ".join(run)] if run else [])


def _quote(phrase: str) -> str:
    return f'"{phrase}"' if " " in phrase else phrase


def plan_queries(question: str, *, max_queries: int) -> list[str]:
    """The question itself, then keyword and entity variants; 1..max_queries, no duplicates.
    A question of several facets (`split_facets`) gets each facet's plan in turn: its
    first query from every facet, then its second..., at least one query per facet."""
    facets = split_facets(question)
    if len(facets) == 1:
        return _plan_one(question, max_queries=max_queries)
    plans = [_plan_one(f, max_queries=max_queries) for f in facets]
    turns = [q for turn in itertools.zip_longest(*plans) for q in turn if q]
    return _dedupe(turns, max(max_queries, len(facets)))


def _plan_one(question: str, *, max_queries: int) -> list[str]:
    """`plan_queries` of one facet."""
    question = " ".join(question.split())
    phrases = _QUOTED.findall(question)
    rest = _QUOTED.sub(" ", question)
    keywords = _keywords(rest)
    entities = [e for e in _entities(rest) if e.casefold() not in map(str.casefold, phrases)]
    entity_words = {w.casefold() for e in entities for w in e.split()}
    others = [k for k in keywords if k.casefold() not in entity_words]
    candidates = [
        question,
        " ".join([_quote(p) for p in phrases] + keywords),
        " ".join([_quote(p) for p in phrases] + [_quote(e) for e in entities] + others[:2])
        if entities or phrases
        else "",
        " ".join(phrases + keywords) if phrases else "",  # the same words, unquoted: broader
    ]
    if len(entities) > 1:  # comparisons: one query per entity finds pages about each alone
        quoted = [_quote(p) for p in phrases]
        candidates += [" ".join([*quoted, _quote(e), *others[:3]]) for e in entities]
    return _dedupe(candidates, max(1, max_queries)) or [question]


_SYSTEM_PROMPT = (
    "You plan web searches for a research question. Answer with one JSON object: "
    '{{"queries": [...], "facets": [...]}}. "queries": {n} distinct, short search-engine '
    "queries (strings), most useful first, covering the question's key entities, synonyms "
    'and sub-questions. "facets": the distinct things the question asks, each a short '
    "self-contained question (at most {m}); one facet, the question itself, when it asks "
    "one thing. Output only the JSON object."
)


def parse_facets(content: str) -> list[str] | None:
    """The facets of an LLM answer (a JSON object's `facets`, maybe fenced): 1..MAX_FACETS
    non-empty strings of at most MAX_FACET_CHARS, case-insensitive duplicates dropped;
    None when the answer has no such list (any item not a string, empty or too long)."""
    text = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", content.strip())
    start, end = text.find("{"), text.rfind("}")
    try:
        answer = json.loads(text[start : end + 1]) if 0 <= start < end else None
    except ValueError:
        return None
    items = answer.get("facets") if isinstance(answer, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return None
    facets: list[str] = []
    for item in items:
        facet = " ".join(clean_text(item).split())
        if not facet or len(facet) > MAX_FACET_CHARS:
            return None
        if facet.casefold() not in {f.casefold() for f in facets}:
            facets.append(facet)
    return facets if 1 <= len(facets) <= MAX_FACETS else None


def parse_query_list(content: str) -> list[str]:
    """Queries from an LLM answer: a JSON array (maybe fenced, maybe under "queries"),
    else one query per bulleted or numbered line; [] when there is neither."""
    text = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", content.strip())
    start, end = text.find("["), text.rfind("]")
    braces = text[text.find("{") : text.rfind("}") + 1]
    candidates: object = None
    for chunk in (text, braces, text[start : end + 1] if 0 <= start < end else ""):
        try:
            candidates = json.loads(chunk)
            break
        except ValueError:
            continue
    if isinstance(candidates, dict):
        candidates = candidates.get("queries")
    if isinstance(candidates, list):
        return [c.strip() for c in candidates if isinstance(c, str) and c.strip()]
    # Only list items: a prose refusal must not become a query.
    items = (_LIST_ITEM.match(line) for line in text.splitlines())
    return [item.group(1).strip().strip('"') for item in items if item and item.group(1).strip()]


class LLMPlanner:
    """Asks a chat model for queries and facets; falls back to the rules on any failure."""

    def __init__(self, client: openai.OpenAI, model: str) -> None:
        self.client = client
        self.model = model

    def plan(self, question: str, max_queries: int) -> QueryPlan:
        """The question first, then the model's queries, and the model's facets (one facet:
        the question itself); the rule-based plan if the model fails, the rule-based facets
        if its facets are not valid (`parse_facets`)."""
        system = _SYSTEM_PROMPT.format(n=max_queries, m=MAX_FACETS)
        try:
            completion = self.client.chat.completions.create(
                model=self.model,
                temperature=0,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
            )
            content = completion.choices[0].message.content or ""
            queries = parse_query_list(content)
            if not queries:
                raise ValueError("no queries in the model's answer")
        except Exception as exc:  # any failure: the rule-based plan is always good enough
            logger.warning(
                "llm planner failed, using rules", extra={"model": self.model, "exc": repr(exc)}
            )
            return plan_question(question, max_queries=max_queries)
        question = " ".join(question.split())
        facets = parse_facets(content)
        if facets is None:
            logger.warning("llm planner gave no valid facets, using rules",
                           extra={"model": self.model})  # fmt: skip
            facets = split_facets(question)
        elif len(facets) == 1:  # one thing asked: the question itself, as the rules have it
            facets = [question]
        return QueryPlan(_dedupe([question, *queries], max(1, max_queries)), facets)
