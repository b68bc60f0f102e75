"""The tree keeps the shape docs/architecture.md draws: floors that import only downwards,
no import circle, no file over 500 lines, and a layout block that names what is there.

Read from the source with `ast` (nothing is imported), as installed: `api/`, `workers/`
and `cli/` are `webctx.api`, `webctx.workers` and `webctx.cli`."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = {
    "webctx": "webctx",
    "api": "webctx.api",
    "workers": "webctx.workers",
    "cli": "webctx.cli",
}
"""Checkout folder -> the package name it installs as."""

FLOORS: list[set[str]] = [
    {
        "webctx",
        "webctx.errors",
        "webctx.models",
        "webctx.problems",
        "webctx.knobs",
        "webctx.logging",
        "webctx.keys",
        "webctx.allocator",
        "webctx.search_names",
    },
    {"webctx.protocols", "webctx.tokens"},
    {
        "webctx.config_file",
        "webctx.env_names",
        "webctx.breaker_settings",
        "webctx.admission_settings",
        "webctx.deep_settings",
        "webctx.fetch_settings",
        "webctx.search_settings",
        "webctx.prefilter_settings",
        "webctx.coverage_settings",
        "webctx.settings",
        "webctx.devweb",
    },
    {"webctx.net"},
    {"webctx.stages"},
    {"webctx.jobs", "webctx.adapters"},
    {"webctx.index", "webctx.demo"},
    {"webctx.workers"},
    {"webctx.api", "webctx.cli"},
]
"""Rooms (a sub-package, or a module directly in webctx/) from the ground floor up. A room
imports from its own floor's rooms only when the graph stays without circles; never from
a floor above."""

MAX_LINES = 500
CHECKED_FOLDERS = ("webctx", "api", "workers", "cli", "bench", "tests", "scripts")


def _modules() -> Iterator[tuple[str, Path]]:
    for folder, package in INSTALLED.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join([package, *parts]), path


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


@cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the webctx modules it imports (anywhere in the file, TYPE_CHECKING too)."""
    known = dict(_modules())
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in INSTALLED and name in known:
                    targets.add(name)
                elif name.split(".")[0] in INSTALLED:
                    parent = name.rsplit(".", 1)[0]
                    if parent in known and parent != module:
                        targets.add(parent)
        targets.discard(module)
        graph[module] = targets
    return graph


def _floor(room: str) -> int:
    for number, rooms in enumerate(FLOORS):
        if room in rooms:
            return number
    raise AssertionError(f"{room} is on no floor: add it to FLOORS (and to docs/architecture.md)")


def test_every_room_is_on_a_floor() -> None:
    for module in import_graph():
        _floor(_room(module))


def test_no_import_runs_up_a_floor() -> None:
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        for target in targets
        if _floor(_room(target)) > _floor(_room(module))
    )
    assert upward == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_between_modules() -> None:
    assert _circles(import_graph()) == []


def test_no_import_circle_between_rooms() -> None:
    rooms: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        room = _room(module)
        rooms.setdefault(room, set()).update(_room(t) for t in targets if _room(t) != room)
    assert _circles(rooms) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_library_never_imports_the_workers_the_api_or_the_cli() -> None:
    outer = ("webctx.workers", "webctx.api", "webctx.cli")
    reaching = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if not module.startswith(outer)
        for target in targets
        if target.startswith(outer)
    )
    assert reaching == []


@pytest.mark.parametrize("folder", CHECKED_FOLDERS)
def test_no_file_is_over_500_lines(folder: str) -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def _layout_block() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    match = re.search(r"## Layout\n\n```\n(.*?)```", text, re.S)
    assert match, "docs/architecture.md has no Layout code block"
    return match.group(1)


def test_the_layout_block_names_every_room_and_module() -> None:
    block = _layout_block()
    words = set(re.findall(r"[A-Za-z_][\w.]*/?", block))
    missing = []
    for entry in sorted((ROOT / "webctx").iterdir()):
        if entry.name.startswith(("_", ".")) or entry.suffix not in ("", ".py"):
            continue
        name = entry.name + ("/" if entry.is_dir() else "")
        if name not in words:
            missing.append(f"webctx/{name}")
        if entry.is_dir():
            for module in sorted(entry.glob("*.py")):
                if module.stem != "__init__" and module.stem not in words:
                    missing.append(str(module.relative_to(ROOT)))
    for folder in ("api", "workers", "cli", "deploy", "bench"):
        if f"{folder}/" not in words:
            missing.append(f"{folder}/")
    for module in sorted((ROOT / "workers").glob("*.py")):
        if module.stem != "__init__" and module.stem not in words:
            missing.append(str(module.relative_to(ROOT)))
    assert missing == []


def test_the_layout_block_names_nothing_that_is_gone() -> None:
    block = _layout_block()
    gone = [
        name
        for name in re.findall(r"\b([a-z_]+(?:\.py|/))", block)
        if name.endswith(".py")
        and not (ROOT / name).exists()
        and not any(any((ROOT / folder).rglob(name)) for folder in INSTALLED)
        or name.endswith("/")
        and not (ROOT / name).is_dir()
        and not (ROOT / "webctx" / name).is_dir()
        and not (ROOT / "deploy" / name).is_dir()
        and not (ROOT / "api" / name).is_dir()
    ]
    assert gone == []
