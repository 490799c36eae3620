"""A leader keeps its lease through one long step (a duty that outlasts the lease), but not
through a step stuck for longer than KEEP_LEASE_FOR_LEASES leases: then a standby takes over."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.helpers.wait import wait_for
from treadle.engine.leadership import Leadership
from treadle.scheduler import loop as scheduler_loop
from treadle.scheduler.loop import Scheduler
from treadle.store.database import Database

#: Each test waits out real leases (about 6 s): `slow`, left out of the quick subset.
pytestmark = pytest.mark.slow
LEASE_S = 3.0


class BlockingDuty:
    """Stands in for a duty that takes long under load: blocks until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> dict[str, int]:
        self.entered.set()
        self.release.wait(120)
        return {}


@pytest.fixture
def leader(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Scheduler, BlockingDuty]]:
    found = Scheduler(db, tick_s=0.05, leader_lease_s=LEASE_S, holder="keeper-test")
    duty = BlockingDuty()
    monkeypatch.setattr(found, "check_freshness", duty)
    thread = threading.Thread(target=found.run, daemon=True)
    thread.start()
    yield found, duty
    duty.release.set()
    found.stop()
    thread.join(timeout=30)


def _rival(db: Database) -> Leadership:
    return Leadership(db, holder="rival", lease_s=LEASE_S)


def test_a_step_longer_than_the_lease_keeps_the_lease(
    db: Database, leader: tuple[Scheduler, BlockingDuty]
) -> None:
    scheduler, duty = leader
    wait_for(duty.entered.is_set, timeout=60, message="the long duty to start")
    epoch = scheduler.leadership.epoch
    assert epoch is not None
    rival = _rival(db)
    held_until = time.monotonic() + 2 * LEASE_S  # two leases: without renewals it would lapse in one
    while time.monotonic() < held_until:
        assert not rival.refresh(), "a standby took the lease while the leader's step ran long"
        time.sleep(0.2)
    assert scheduler.leadership.is_leader() and scheduler.leadership.epoch == epoch
    duty.release.set()
    wait_for(lambda: scheduler.in_step_since == float("inf"), timeout=60, message="the step to end")
    assert scheduler.leadership.epoch == epoch


def test_a_step_stuck_past_the_bound_lets_the_lease_lapse(
    db: Database, leader: tuple[Scheduler, BlockingDuty], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_loop, "KEEP_LEASE_FOR_LEASES", 1)
    scheduler, duty = leader
    wait_for(duty.entered.is_set, timeout=60, message="the long duty to start")
    epoch = scheduler.leadership.epoch
    assert epoch is not None
    rival = _rival(db)
    wait_for(rival.refresh, timeout=60, interval=0.2, message="a standby to take the lapsed lease")
    assert rival.epoch is not None and rival.epoch > epoch
    assert not scheduler.leadership.is_leader()
