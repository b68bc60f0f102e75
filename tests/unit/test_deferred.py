"""Deferred work's turn: one at a time per process, waiting while something more urgent
runs, and handing over once its budget is spent."""

from __future__ import annotations

import threading
import time

from webctx.workers import deferred


def test_a_pause_waits_while_urgent_work_runs_then_lets_the_deferred_work_go() -> None:
    urgent = threading.Event()
    urgent.set()
    threading.Timer(0.3, urgent.clear).start()
    with deferred.turn(quiet_s=0.2, urgent=urgent.is_set) as pause:
        started = time.monotonic()
        assert pause()
        assert time.monotonic() - started >= 0.45  # the urgent work, then the quiet time
        started = time.monotonic()
        assert pause()  # quiet for long enough already: at once
        assert time.monotonic() - started < 0.1


def test_a_turn_that_waited_its_budget_out_says_to_hand_the_rest_over() -> None:
    with deferred.turn(budget_s=0.2, quiet_s=0, urgent=lambda: True) as pause:
        assert not pause()


def test_one_turn_at_a_time_in_a_process() -> None:
    order: list[str] = []
    inside = threading.Event()

    def second() -> None:
        with deferred.turn(quiet_s=0, urgent=lambda: False) as pause:
            order.append("second")
            assert pause()

    with deferred.turn(quiet_s=0, urgent=lambda: False) as pause:
        assert pause()
        thread = threading.Thread(target=second)
        thread.start()
        inside.wait(0.2)  # the second turn waits for this one
        order.append("first")
    thread.join(timeout=5)
    assert order == ["first", "second"]


def test_a_turn_not_had_within_the_budget_hands_over_at_once() -> None:
    with deferred.turn(quiet_s=0, urgent=lambda: False):
        got: list[bool] = []

        def other() -> None:
            with deferred.turn(budget_s=0.1, quiet_s=0, urgent=lambda: False) as pause:
                got.append(pause())

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=5)
    assert got == [False]
