"""One owner per Redis key family: no other module spells a `webctx:` key or reaches into
an owner's client (webctx/keys.py lists the families and their owners)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from webctx.keys import FAMILIES, OWNER_PARTS, family_of

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = {"webctx": "webctx", "api": "webctx.api", "workers": "webctx.workers",
             "cli": "webctx.cli", "bench": "bench"}  # fmt: skip
OWNERS = {family.owner for family in FAMILIES} | {"webctx.keys"} | set(OWNER_PARTS)


def _modules() -> dict[str, ast.Module]:
    """Dotted name -> parsed source of every module of the product and the benchmarks."""
    found = {}
    for folder, package in INSTALLED.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = ast.parse(path.read_text(), str(path))
    return found


MODULES = _modules()


def _key_literals(tree: ast.Module) -> list[str]:
    """String constants that start a Redis key: `webctx:` then no space (not a log label)
    and no slash (`webctx://`, the MCP resources' URI scheme)."""
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith("webctx:")
            and node.value[7:8] not in ("", " ", "/")]  # fmt: skip


def test_only_the_owners_of_key_families_spell_webctx_keys() -> None:
    spelled = {name: keys for name, tree in MODULES.items() if (keys := _key_literals(tree))}
    assert set(spelled) - OWNERS == set(), {m: spelled[m] for m in set(spelled) - OWNERS}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.pattern)
def test_each_family_is_spelled_by_its_owner(family: object) -> None:
    owner, pattern = family.owner, family.pattern  # type: ignore[attr-defined]
    assert owner in MODULES, f"no module {owner}"
    prefix = pattern.split("{", 1)[0]
    assert any(key.startswith(prefix) or prefix.startswith(key)
               for key in _key_literals(MODULES[owner])), (owner, prefix)  # fmt: skip


def test_no_module_reaches_into_an_owners_client() -> None:
    reached = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in ("r", "_redis"):
                continue
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            if node.attr == "r" or not (on_self and name in OWNERS):
                reached.append(f"{name}:{node.lineno}")
    assert reached == []


def test_every_key_shape_of_the_owners_has_one_family() -> None:
    samples = {"webctx:job:0f3:meta": "webctx:job:{job_id}:{part}",
               "webctx:job:0f3:done:embed": "webctx:job:{job_id}:{part}",
               "webctx:index:refs:ab12": "webctx:index:refs:{content_sha256}",
               "webctx:index:acme.co:pages": "webctx:index:{tenant}:pages",
               "webctx:sources:due": "webctx:sources:due",
               "webctx:sources:claim:acme/0a1b:17.000000": (
                   "webctx:sources:claim:{tenant}/{source_id}:{due}"),
               "webctx:sources:acme": "webctx:sources:{tenant}",
               "webctx:rl:3c9e:pause": "webctx:rl:{namespace}:{part}"}  # fmt: skip
    for key, pattern in samples.items():
        family = family_of(key)
        assert family is not None and family.pattern == pattern, key
    assert family_of("webctx:unknown:thing") is None
    assert len({f.pattern for f in FAMILIES}) == len(FAMILIES)
