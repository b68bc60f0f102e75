"""Have glibc's malloc give freed memory back to the OS in a long-lived worker process.

With glibc's defaults a worker keeps memory it has freed. The mmap threshold grows to the
largest block freed so far (up to 32 MB), so once a worker has freed one large buffer (a
page's vectors, a Redis reply), later ones of that size come from the heap, where freed
space stays with the process. Each thread that allocates may also get an arena of its own.
Fixing the threshold at glibc's initial 128 KiB, trimming the heap's top above 128 KiB
and capping arenas at 2 keeps a worker's memory at what it uses.

Measured in the batch bench's store/rank process (bench/batch_scaling.py, 4 workers):
anonymous memory grew +8 and +12 MB over the cold batch in two runs with glibc's defaults,
+4 MB in two runs with these settings.

A setting whose `MALLOC_*_` environment variable is set is left as the variable made it.
Off glibc (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, 128 * 1024),
    "MALLOC_TRIM_THRESHOLD_": (M_TRIM_THRESHOLD, 128 * 1024),
    "MALLOC_ARENA_MAX": (M_ARENA_MAX, 2),
}
"""glibc's environment variable for each setting: its mallopt parameter and our value."""


def return_freed_memory() -> dict[str, int]:
    """Apply the settings to this process (and children it forks later); returns those
    applied, by environment variable name."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError off glibc
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = {}
    for name, (param, value) in SETTINGS.items():
        if name not in os.environ and mallopt(param, value) == 1:
            applied[name] = value
    return applied
