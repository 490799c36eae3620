"""The worker's self-fencing clock: trust ends `lease - margin` after the last successful send."""

from __future__ import annotations

import threading
import time

from treadle.worker.fencing import LeaseClock


def test_trust_runs_from_the_send_time_of_the_last_successful_renewal() -> None:
    clock = LeaseClock(lease_s=3.0, margin_s=1.0)
    clock.granted([(1, 1), (2, 1)], sent_at=10.0)
    assert clock.expired(now=11.9) == []
    clock.granted([(1, 1)], sent_at=11.0)  # (2, 1) was not renewed
    assert clock.expired(now=12.1) == [(2, 1)]
    assert clock.deadline((1, 1)) == 13.0
    assert clock.expired(now=13.1) == [(1, 1), (2, 1)]


def test_an_older_send_never_extends_trust_and_a_forgotten_attempt_is_not_guarded() -> None:
    clock = LeaseClock(lease_s=30.0, margin_s=5.0)
    clock.granted([(7, 2)], sent_at=100.0)
    clock.granted([(7, 2)], sent_at=90.0)  # a slow call that returned late
    assert clock.deadline((7, 2)) == 125.0
    clock.forget((7, 2))
    assert clock.deadline((7, 2)) is None
    assert clock.expired(now=1_000.0) == []


def test_the_earliest_deadline_is_the_oldest_send_plus_the_trust_window() -> None:
    clock = LeaseClock(lease_s=3.0, margin_s=1.0)
    assert clock.earliest_deadline() is None
    clock.granted([(1, 1)], sent_at=10.0)
    clock.granted([(2, 1)], sent_at=11.0)
    assert clock.earliest_deadline() == 12.0
    clock.forget((1, 1))
    assert clock.earliest_deadline() == 13.0


def test_the_watchdog_wait_ends_just_past_the_deadline_or_on_a_grant() -> None:
    clock = LeaseClock(lease_s=0.3, margin_s=0.1)
    clock.granted([(1, 1)], sent_at=time.monotonic())
    clock.wait_for_deadline(longest_s=60.0)  # returns at the deadline, not after a minute
    assert clock.expired(now=time.monotonic()) == [(1, 1)]

    idle = LeaseClock(lease_s=30.0, margin_s=5.0)
    returned = threading.Event()

    def wait() -> None:
        idle.wait_for_deadline(longest_s=120.0)
        returned.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    began = time.monotonic()
    while not returned.is_set() and time.monotonic() - began < 60:
        idle.granted([(9, 1)], sent_at=time.monotonic())  # a claim wakes the sleeping watchdog
        returned.wait(0.05)
    assert returned.is_set()


def test_a_claim_that_falls_due_before_the_planned_wake_up_wakes_the_watchdog() -> None:
    clock = LeaseClock(lease_s=30.0, margin_s=5.0)
    now = time.monotonic()
    clock.granted([(1, 1)], sent_at=now - 1.0)  # due in 24 s
    returned = threading.Event()

    def wait() -> None:
        clock.wait_for_deadline(longest_s=120.0)
        returned.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    while clock._wake_at == float("inf"):
        time.sleep(0.01)
    clock.granted([(1, 1)], sent_at=time.monotonic())  # a renewal: later, no need to wake
    assert not returned.wait(0.2)
    # A claim sent long ago (its call blocked) that returned only now: due before the wake-up.
    clock.granted([(2, 1)], sent_at=now - 21.0)
    assert returned.wait(30)
