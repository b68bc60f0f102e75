"""HTML extraction in child processes (webctx/adapters/extract_children.py): the same
extraction, a hung child killed at its deadline and replaced, and the calling thread's
own extraction whenever no child is idle."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fetch_site import ARTICLE
from webctx.adapters.extract_children import ExtractionChildren
from webctx.errors import ExtractionError
from webctx.models import Download
from webctx.stages.fetch import _extract_html, extract_page

TARGET = "tests.unit.test_extract_children:_extract_or_hang"


def _extract_or_hang(html: str, url: str) -> Any:
    """In the child: hang on "hang", else extract as the service does."""
    if html == "hang":
        time.sleep(3600)
    return _extract_html(html, url)


def _ready(children: ExtractionChildren, timeout_s: float = 60.0) -> Callable[[str], Any]:
    """Wait until a child answers; then extract through the children."""
    deadline = time.monotonic() + timeout_s
    while children(ARTICLE, "https://example.org/a", 30.0) is None:
        assert time.monotonic() < deadline, "no extraction child started"
        time.sleep(0.05)
    return lambda html: children(html, "https://example.org/a", 30.0)


@pytest.fixture
def children() -> Iterator[ExtractionChildren]:
    pool = ExtractionChildren(1, target=TARGET)
    pool.start()
    yield pool
    pool.close()


def test_a_child_extracts_a_page_as_this_process_would(children: ExtractionChildren) -> None:
    extract = _ready(children)
    assert extract(ARTICLE) == _extract_html(ARTICLE, "https://example.org/a")
    download = Download(url="https://example.org/a", final_url="https://example.org/a",
                        status=200, content_type="text/html; charset=utf-8",
                        body=ARTICLE.encode())  # fmt: skip
    here = extract_page(download)
    assert extract_page(download, html=children) == here


def test_a_hung_child_is_killed_at_the_deadline_and_replaced(
    children: ExtractionChildren,
) -> None:
    _ready(children)
    started = time.monotonic()
    with pytest.raises(ExtractionError, match="took over 0.5s"):
        children("hang", "https://example.org/h", 0.5)
    assert time.monotonic() - started < 10
    extract = _ready(children)  # a new child took its place
    assert extract(ARTICLE) is not None


def test_with_no_idle_child_the_caller_extracts(children: ExtractionChildren) -> None:
    assert ExtractionChildren(1)(ARTICLE, "https://example.org/a", 5.0) is None  # not started
    _ready(children)
    closed = ExtractionChildren(1, target=TARGET)
    closed.close()
    closed.start()  # closed: its children stop as they start
    time.sleep(0.2)
    assert closed(ARTICLE, "https://example.org/a", 5.0) is None
