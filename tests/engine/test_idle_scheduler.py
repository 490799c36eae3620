"""An idle leader (nothing in flight) sleeps until a wake-up instead of ticking every `tick_s`,
where wake-ups reach it; a trigger wakes it back to its usual pace. Without wake-ups (MariaDB)
it keeps ticking."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.helpers.wait import wait_for
from treadle import dag, task
from treadle.engine.cancellation import cancel_run
from treadle.engine.dags import sync_dags
from treadle.engine.runs import trigger_run
from treadle.scheduler.loop import Scheduler
from treadle.store import activity
from treadle.store.database import Database


@task
def noop() -> int:
    return 1


@dag(dag_id="idle_manual")
def idle_manual() -> None:
    noop()


@pytest.fixture
def scheduler(db: Database) -> Iterator[Scheduler]:
    sync_dags(db, structures=[idle_manual.structure()], scanned_files=[], errors={})
    found = Scheduler(db, tick_s=0.05, leader_lease_s=3.0, holder="idle-test")
    thread = threading.Thread(target=found.run, daemon=True)
    thread.start()
    yield found
    found.stop()
    thread.join(timeout=30)


def test_a_trigger_wakes_an_idle_leader_and_it_idles_again_once_nothing_is_in_flight(
    db: Database, scheduler: Scheduler
) -> None:
    if db.dialect == "mysql":
        pytest.skip("no wake-ups on MariaDB: covered below")
    wait_for(lambda: scheduler.idle, timeout=30, message="the leader to find nothing in flight")
    assert scheduler.wakeups

    run = trigger_run(db, "idle_manual", triggered_by="test")

    wait_for(lambda: not scheduler.idle, timeout=30, message="the trigger's wake-up")
    assert db.query(activity.in_flight)
    cancel_run(db, run.run_id, actor="test")
    wait_for(lambda: not db.query(activity.in_flight), timeout=30, message="the run to end")
    wait_for(lambda: scheduler.idle, timeout=30, message="the leader to idle again")


def test_without_wakeups_the_leader_keeps_ticking(db: Database, scheduler: Scheduler) -> None:
    if db.dialect != "mysql":
        pytest.skip("SQLite and PostgreSQL have wake-ups")
    wait_for(lambda: scheduler.leadership.is_leader(), timeout=30, message="leadership")
    passes = scheduler.next_tick_at
    wait_for(lambda: scheduler.next_tick_at > passes, timeout=30, message="another pass")
    assert not scheduler.wakeups and not scheduler.idle
