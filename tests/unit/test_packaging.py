"""The wheel installs everything under `webctx/`: api/, workers/ and cli/ as webctx.api,
webctx.workers and webctx.cli, no top-level `api`, `workers` or `celeryconfig` module, and the
build prints no setuptools warning."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"webctx": "webctx", "api": "webctx/api", "workers": "webctx/workers", "cli": "webctx/cli"}
"""Folder of the checkout -> where its files land in the wheel."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[zipfile.ZipFile, str]:
    """The wheel built from a copy of the checkout (the build writes next to its sources),
    and what the build printed."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE", "celeryconfig.py"):
        shutil.copy(ROOT / name, src / name)
    for folder in MAPPED:
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    out = tmp_path_factory.mktemp("dist")
    build = ("import sys, setuptools.build_meta as b; "
             "print(b.build_wheel(sys.argv[1]), file=sys.stderr)")  # fmt: skip
    done = subprocess.run([sys.executable, "-W", "default", "-c", build, str(out)], cwd=src,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    (path,) = out.glob("*.whl")
    return zipfile.ZipFile(path), done.stdout + done.stderr


def test_every_file_of_the_wheel_is_under_webctx(wheel: tuple[zipfile.ZipFile, str]) -> None:
    names = wheel[0].namelist()
    outside = [n for n in names if not n.startswith(("webctx/", "webctx-"))]
    assert outside == []
    assert not any(n.startswith("webctx-") and "/" not in n for n in names)


def test_every_module_of_the_checkout_is_in_the_wheel_under_its_installed_name(
    wheel: tuple[zipfile.ZipFile, str],
) -> None:
    names = set(wheel[0].namelist())
    for folder, installed in MAPPED.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            assert f"{installed}/{path.relative_to(ROOT / folder).as_posix()}" in names, path
    assert "webctx/demo/corpus/manifest.json" in names and "webctx/py.typed" in names


def test_the_console_script_and_the_licence_are_declared(
    wheel: tuple[zipfile.ZipFile, str],
) -> None:
    archive = wheel[0]
    info = next(n.rsplit("/", 1)[0] for n in archive.namelist() if n.endswith("/METADATA"))
    entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "webctx = webctx.cli.main:entry" in entry_points
    metadata = archive.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert f"{info}/licenses/LICENSE" in archive.namelist()


def test_the_build_prints_no_setuptools_warning(wheel: tuple[zipfile.ZipFile, str]) -> None:
    printed = wheel[1]
    assert "Warning" not in printed and "deprecat" not in printed.lower(), printed[-3000:]
