"""How fast an in-process model embeds on the CPU present, as it has shown so far.

A job's rank sizes its embedding work to it (`webctx.stages.compose`, PrefilterSettings
`embed_budget_s`): the same model takes 1.4 ms a chunk on a CPU that multiplies bfloat16
and several times that on one with AVX2 alone, and other work on shared cores slows it
further, so no fixed figure fits every machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

MIN_TEXTS = 8
"""Calls embedding fewer texts are not measured: a question alone is mostly the call's
fixed cost, not the model's speed on a job's chunks."""

CALIBRATION = [
    f"Calibration passage {n}: the glacier retreated up the valley while surveyors measured "
    f"the ice front each summer, noting how far it stood from the moraine, the river and the "
    f"village church, and how the meltwater changed course over {n + 2} decades of records."
    for n in range(32)
]
"""32 texts of 54 model tokens each (a job's chunks of 64 cl100k tokens average about 50),
embedded once when the model loads: the speed a job's first rank is sized to."""


class EmbedSpeed:
    """Chunks a second, an exponentially weighted mean over the measured calls (each
    call's weight `weight`; the latest calls count most, as the machine's load changes)."""

    def __init__(self, *, weight: float = 0.3) -> None:
        self.weight = weight
        self._rate: float | None = None
        self._lock = threading.Lock()

    @property
    def chunks_per_s(self) -> float | None:
        """The current estimate, None before any measured call."""
        return self._rate

    def observe(self, texts: int, seconds: float) -> None:
        """Count one call that embedded `texts` texts in `seconds` of wall time."""
        if texts < MIN_TEXTS or seconds <= 0:
            return
        rate = texts / seconds
        with self._lock:
            old = self._rate
            self._rate = rate if old is None else old + self.weight * (rate - old)

    @contextmanager
    def timing(self, texts: int) -> Iterator[None]:
        """Measure the block as one call embedding `texts` texts (not when it raises)."""
        started = time.perf_counter()
        yield
        self.observe(texts, time.perf_counter() - started)
