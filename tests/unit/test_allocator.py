"""The worker's allocator settings: freed memory goes back to the OS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FREE_AFTER_A_LARGE_BLOCK = """
import sys
from webctx.allocator import return_freed_memory

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024

applied = return_freed_memory() if sys.argv[1] == "tuned" else {}
large = bytearray(4 << 20)
del large  # by default glibc now serves blocks up to 4 MB from its heap
before = rss_mb()
blocks = [bytearray(512 << 10) for _ in range(200)]  # 100 MB
del blocks[:-1]  # the last one keeps the heap's top in use
print(sorted(applied), rss_mb() - before)
"""


def kept_after_free(mode: str, **env: str) -> tuple[str, int]:
    run = subprocess.run(
        [sys.executable, "-c", FREE_AFTER_A_LARGE_BLOCK, mode],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")},
             "PYTHONPATH": str(REPO), **env},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    applied, kept = run.stdout.rsplit(maxsplit=1)
    return applied, int(kept)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_freed_blocks_go_back_to_the_os_once_the_worker_settings_apply() -> None:
    applied, kept = kept_after_free("tuned")
    assert kept < 10, f"{kept} MB of 100 MB freed still resident"
    assert "MALLOC_MMAP_THRESHOLD_" in applied
    _, kept_by_default = kept_after_free("default")
    assert kept_by_default > 80  # what the settings are for: glibc's default keeps it


def test_a_setting_from_the_environment_is_left_as_it_is() -> None:
    applied, _ = kept_after_free("tuned", MALLOC_ARENA_MAX="4")
    assert "MALLOC_ARENA_MAX" not in applied
    assert "MALLOC_TRIM_THRESHOLD_" in applied
