"""`--dist loadgroup` keeps an `xdist_group`'s tests on one worker (tests/scheduling.py names
the groups where pytest-xdist's own renaming no longer takes effect)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_tests_of_an_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.scheduling import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tmp_path / "test_grouped.py").write_text(
        textwrap.dedent("""
        import os
        from pathlib import Path

        import pytest

        pytestmark = pytest.mark.xdist_group("one")


        @pytest.mark.parametrize("n", range(4))
        def test_record_worker(n):
            out = Path(__file__).parent / f"ran-{n}"
            out.write_text(os.environ["PYTEST_XDIST_WORKER"])
        """)
    )
    # Only this small suite's own options: none the outer run was given through the env.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = {(tmp_path / f"ran-{n}").read_text() for n in range(4)}
    assert len(workers) == 1, workers
