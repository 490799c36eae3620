"""When the worker's next pass claims: only a claim that asked and came back short stops it."""

from __future__ import annotations

from treadle.engine.execution import Cycle
from treadle.worker.worker import _still_hungry


def _cycle(claimed: int = 0, readied: frozenset[str] = frozenset()) -> Cycle:
    return Cycle(endings=[], started=[], claimed=[object()] * claimed, readied_queues=readied)  # type: ignore[list-item]


def test_a_claim_that_came_back_short_stops_claiming_and_a_full_one_keeps_on() -> None:
    assert _still_hungry(True, want=4, cycle=_cycle(claimed=1), queues=["default"]) is False
    assert _still_hungry(True, want=4, cycle=_cycle(claimed=4), queues=["default"]) is True


def test_a_pass_that_asked_for_nothing_because_its_buffer_was_full_keeps_claiming() -> None:
    """It recorded successes while the buffer was full: it learned nothing about the queues.
    Stopping here left a busy worker's buffer to drain before it claimed again."""
    assert _still_hungry(True, want=0, cycle=_cycle(), queues=["default"]) is True


def test_successes_that_readied_work_in_its_queues_make_an_idle_claimer_claim_again() -> None:
    assert _still_hungry(False, want=0, cycle=_cycle(readied=frozenset({"default"})), queues=["default"])
    assert not _still_hungry(False, want=0, cycle=_cycle(readied=frozenset({"gpu"})), queues=["default"])
    assert not _still_hungry(False, want=0, cycle=_cycle(), queues=["default"])


def test_the_default_buffer_covers_what_the_slots_can_finish_during_two_passes() -> None:
    from treadle.worker.worker import BufferSizer

    sizer = BufferSizer()
    assert sizer.target(16, [None, None]) == 0  # nothing known before a slot finished one
    for _ in range(40):
        sizer.observe(0.005)  # passes of 5 ms
    # Two slots at 1 ms an attempt finish 10 attempts per pass: 20 for two passes, capped.
    assert sizer.target(16, [0.001, 0.001]) == 16
    assert sizer.target(64, [0.001, 0.001]) == 20
    # At 10 ms an attempt: 2 for two passes. One slot unknown yet counts as the known one.
    assert sizer.target(64, [0.01, None]) == 2
    # Attempts of a second or more are left queued for idle workers.
    assert sizer.target(64, [1.0, 1.0]) == 0
    assert sizer.target(64, [0.05, 0.05]) == 1
