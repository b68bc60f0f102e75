"""The order and grouping of the suite's tests under pytest-xdist (the hook is imported by
tests/conftest.py; this module imports nothing of webctx, so a pytest run of a few files
can load it cheaply)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first: tests marked `slow`, then the other integration tests, then the unit
    tests (each group in collection order). Under xdist every worker takes its next test
    from this order, so the long tests overlap one another at the start and short ones
    fill in at the end, instead of a minute-long test starting last and running alone."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is not None:
            return 0
        return 1 if "integration" in item.path.parts else 2

    items.sort(key=rank)  # stable: the order within a group stays
    if config.getoption("loadgroup", default=False):
        _name_xdist_groups(items)


def _name_xdist_groups(items: list[pytest.Item]) -> None:
    """Append `@group` to the node id of each `xdist_group` test, as pytest-xdist does with
    `--dist loadgroup`; its own renaming writes `Node._nodeid`, which pytest 9.2 no longer
    reads (node ids are structured there: pytest-xdist issue 1386), so every group's tests
    were spread over all workers, each starting the module's stack again."""
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})  # fmt: skip
        suffix = "@" + "_".join(names)
        if not names or item.nodeid.endswith(suffix):
            continue  # no group, or pytest-xdist's renaming worked
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]
        else:
            item._nodeid = item.nodeid + suffix  # type: ignore[attr-defined]
