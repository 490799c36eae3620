"""Persisted deadlines on SQLite and PostgreSQL: dispatch, execution, and handing work back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

import pytest
import sqlalchemy as sa

from tests.helpers.wait import wait_for
from treadle import dag, task
from treadle.domain.durations import DEFAULT_TASK_TIMEOUT_S
from treadle.engine import queries
from treadle.engine.execution import claim_task_instances, complete_attempt, hand_back_attempts
from treadle.engine.reaper import enforce_execution_deadlines, expire_dispatch_deadlines, promote_due_retries
from treadle.engine.runs import trigger_run
from treadle.engine.workers import record_worker
from treadle.store.database import db_now
from treadle.store.tables import task_instances
from treadle.testing import DagRunner


@task(queue="nowhere", queue_timeout=0.2, retries=1, retry_delay=0)
def stranded() -> None:
    return None


@task(timeout=0.2, retries=0)
def bounded() -> str:
    return "late"


@task(retries=1, retry_delay=0)
def plain() -> str:
    return "ok"


@dag(dag_id="deadlines")
def deadlines() -> None:
    stranded()
    bounded()
    plain()


@pytest.fixture
def runner(db_url: str) -> Iterator[DagRunner]:
    r = DagRunner(deadlines, database_url=db_url)
    yield r
    r.close()


def _state(runner: DagRunner, run_id: str, task_id: str) -> str:
    return next(t.state for t in queries.run_detail(runner.db, run_id).task_instances if t.task_id == task_id)


def test_claim_persists_execution_deadline_only_for_tasks_with_a_timeout(runner: DagRunner) -> None:
    # A task without its own timeout gets the deployment's default, unless that is off.
    for default_s in (DEFAULT_TASK_TIMEOUT_S, None):
        run = trigger_run(runner.db, "deadlines", triggered_by="t", default_task_timeout_s=default_s)
        claimed = claim_task_instances(
            runner.db, worker_id="w", hostname="h", queues=["default"], limit=10, lease_s=30
        )
        assert {t.task_id for t in claimed} == {"bounded", "plain"}
        ti = task_instances.c
        with runner.db.read() as conn:
            rows = {
                r.task_id: r for r in conn.execute(sa.select(task_instances).where(ti.run_id == run.run_id))
            }
        bounded_row = rows["bounded"]
        bounded_s = (bounded_row.timeout_at - bounded_row.started_at).total_seconds()
        assert bounded_s == pytest.approx(0.2, abs=0.002)
        plain_row = rows["plain"]
        if default_s is None:
            assert plain_row.timeout_at is None
        else:
            plain_s = (plain_row.timeout_at - plain_row.started_at).total_seconds()
            assert plain_s == pytest.approx(default_s, abs=0.002)


def test_queue_no_worker_serves_ends_dispatch_timeout_with_the_reason(runner: DagRunner) -> None:
    run_id = runner.trigger()
    record_worker(runner.db, worker_id="w-default", hostname="h", pid=1, queues=["default"], concurrency=2)

    wait_for(
        lambda: expire_dispatch_deadlines(runner.db, worker_stale_s=60) == 1,
        timeout=10,
        message="the dispatch deadline to pass",
    )
    assert _state(runner, run_id, "stranded") == "retry_wait"
    wait_for(lambda: promote_due_retries(runner.db) >= 1, timeout=5, message="the retry to be queued")
    wait_for(
        lambda: expire_dispatch_deadlines(runner.db, worker_stale_s=60) == 1,
        timeout=10,
        message="the second dispatch deadline",
    )

    detail = queries.run_detail(runner.db, run_id)
    attempts = [a for a in detail.attempts if a.task_id == "stranded"]
    assert [a.outcome for a in attempts] == ["dispatch_timeout", "dispatch_timeout"]
    assert all("no live worker serves queue 'nowhere'" in (a.error_message or "") for a in attempts)
    assert all(a.started_at is None for a in attempts)
    assert _state(runner, run_id, "stranded") == "dead_letter"


def test_reaper_enforces_a_deadline_the_worker_did_not(runner: DagRunner) -> None:
    run_id = runner.trigger()
    claimed = claim_task_instances(
        runner.db, worker_id="stuck", hostname="h", queues=["default"], limit=10, lease_s=300
    )
    late = next(t for t in claimed if t.task_id == "bounded")

    wait_for(
        lambda: enforce_execution_deadlines(runner.db, grace_s=0) == 1,
        timeout=10,
        message="the execution deadline to pass",
    )
    assert not complete_attempt(runner.db, late, worker_id="stuck", hostname="h", value="late").applied

    detail = queries.run_detail(runner.db, run_id)
    [attempt] = [a for a in detail.attempts if a.task_id == "bounded"]
    assert (attempt.outcome, attempt.error_type, attempt.late_result) == (
        "timed_out",
        "TaskTimeout",
        "late success discarded",
    )
    assert _state(runner, run_id, "bounded") == "dead_letter"


def test_hand_back_requeues_without_spending_a_retry(runner: DagRunner) -> None:
    run_id = runner.trigger()
    claimed = claim_task_instances(
        runner.db, worker_id="leaving", hostname="h", queues=["default"], limit=10, lease_s=30
    )
    assert hand_back_attempts(runner.db, claimed, worker_id="leaving", hostname="h") == 2
    # Only the holder can hand back, and only once.
    assert hand_back_attempts(runner.db, claimed, worker_id="leaving", hostname="h") == 0

    again = claim_task_instances(
        runner.db, worker_id="next", hostname="h", queues=["default"], limit=10, lease_s=30
    )
    assert sorted(t.attempt for t in again) == [2, 2]
    assert all(t.attempt - t.budget_base == 1 for t in again)  # still the first try of the budget
    detail = queries.run_detail(runner.db, run_id)
    handed = [a for a in detail.attempts if a.outcome == "rejected"]
    assert {(a.task_id, a.attempt, a.error_type) for a in handed} == {
        ("bounded", 1, "WorkerShutdown"),
        ("plain", 1, "WorkerShutdown"),
    }


def test_a_worker_that_died_before_the_deadline_is_lost_not_timed_out(runner: DagRunner) -> None:
    from treadle.engine.reaper import reap_expired_leases

    run_id = runner.trigger()
    claim_task_instances(runner.db, worker_id="gone", hostname="h", queues=["default"], limit=10, lease_s=0.5)

    wait_for(lambda: reap_expired_leases(runner.db) == 2, timeout=10, message="both leases to expire")

    outcomes = {a.task_id: (a.outcome, a.error_type) for a in queries.run_detail(runner.db, run_id).attempts}
    # The worker's last heartbeat (its claim) came before the 0.2 s deadline: it died, it did
    # not overrun, so the attempt is lost and spends no retry (bounded has retries=0).
    assert outcomes == {"bounded": ("lost", "LeaseExpired"), "plain": ("lost", "LeaseExpired")}
    assert _state(runner, run_id, "bounded") == "retry_wait"
    assert _state(runner, run_id, "plain") == "retry_wait"


def test_a_deadline_that_passed_while_the_worker_still_heartbeated_is_a_timeout(runner: DagRunner) -> None:
    from treadle.engine.execution import extend_leases
    from treadle.engine.reaper import reap_expired_leases

    run_id = runner.trigger()
    claimed = claim_task_instances(
        runner.db, worker_id="stuck", hostname="h", queues=["default"], limit=10, lease_s=0.5
    )
    held = [(t.task_instance_id, t.attempt) for t in claimed]

    def overdue() -> bool:
        with runner.db.read() as conn:
            deadline = conn.execute(
                sa.select(task_instances.c.timeout_at).where(task_instances.c.task_id == "bounded")
            ).scalar_one()
            return bool(deadline < db_now(conn))

    wait_for(overdue, timeout=10, message="the 0.2 s deadline to pass")
    # The worker is alive past the deadline (it renews), then goes silent.
    assert extend_leases(runner.db, worker_id="stuck", held=held, lease_s=0.5) == (set(held), set())
    wait_for(lambda: reap_expired_leases(runner.db) == 2, timeout=10, message="both leases to expire")

    outcomes = {a.task_id: (a.outcome, a.error_type) for a in queries.run_detail(runner.db, run_id).attempts}
    assert outcomes["bounded"] == ("timed_out", "TaskTimeout")
    assert outcomes["plain"] == ("lost", "LeaseExpired")
    assert _state(runner, run_id, "bounded") == "dead_letter"  # the overrun spent its only attempt
    assert _state(runner, run_id, "plain") == "retry_wait"  # a loss never spends the budget


def _expired_leases(runner: DagRunner) -> bool:
    with runner.db.read() as conn:
        expiries = conn.execute(
            sa.select(task_instances.c.lease_expires_at).where(task_instances.c.state == "running")
        ).scalars()
        now = db_now(conn)
        return all(e is not None and e < now for e in expiries)


def test_lease_evidence_read_across_a_stall_reaps_nothing(
    runner: DagRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database answered only after a gap (frozen, or retried through a restart): its clock
    ran on while no worker could renew, so leases that expired then are not judged on it."""
    from treadle.engine import reaper

    run_id = runner.trigger()
    claim_task_instances(runner.db, worker_id="w", hostname="h", queues=["default"], limit=10, lease_s=0.3)
    wait_for(lambda: _expired_leases(runner), timeout=10, message="both leases to lapse")

    real_now = reaper.db_now

    def stalled_now(conn: sa.Connection) -> datetime:
        time.sleep(0.3)
        return real_now(conn)

    monkeypatch.setattr(reaper, "db_now", stalled_now)
    assert reaper.reap_expired_leases(runner.db, evidence_within_s=0.1) == 0
    assert {_state(runner, run_id, t) for t in ("bounded", "plain")} == {"running"}
    monkeypatch.setattr(reaper, "db_now", real_now)
    assert reaper.reap_expired_leases(runner.db, evidence_within_s=5) == 2


def test_a_scheduler_step_that_stalled_holds_deadlines_before_it_reaps(runner: DagRunner) -> None:
    """A stall that began earlier in the same step (firing schedules, renewing leadership)
    holds lease expiries for a lease at once, not only after the step."""
    from treadle.scheduler.loop import Scheduler

    run_id = runner.trigger()
    claim_task_instances(runner.db, worker_id="w", hostname="h", queues=["default"], limit=10, lease_s=0.3)
    wait_for(lambda: _expired_leases(runner), timeout=10, message="both leases to lapse")
    scheduler = Scheduler(runner.db, tick_s=0.1, lease_s=0.5)
    try:
        scheduler.step_began = time.monotonic() - 1.0  # this step waited out a stall
        changes = scheduler.tick()
        assert "leases_reaped" not in changes
        assert {_state(runner, run_id, t) for t in ("bounded", "plain")} == {"running"}

        scheduler.step_began = time.monotonic()
        reaped = wait_for(
            lambda: scheduler.tick().get("leases_reaped"), timeout=10, message="the hold to end"
        )
        assert reaped == 2
    finally:
        scheduler.fire_pool.shutdown()


def test_deadlines_wait_a_lease_after_the_first_step_that_follows_failed_ones(
    runner: DagRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps that failed (the database was down) back off for longer than a lease. The first step
    that succeeds may come just after the server returned, before any worker could renew, so it
    must not reap on leases that lapsed during the outage: the hold runs from that step on."""
    import threading

    from treadle.scheduler import loop

    run_id = runner.trigger()
    claim_task_instances(runner.db, worker_id="w", hostname="h", queues=["default"], limit=10, lease_s=0.3)
    wait_for(lambda: _expired_leases(runner), timeout=10, message="both leases to lapse")
    monkeypatch.setattr(loop.random, "random", lambda: 1.0)  # the longest backoff of each range
    scheduler = loop.Scheduler(runner.db, tick_s=0.1, lease_s=0.5)
    outage = {"steps": 4}  # backoffs 0.3, 0.6, 1.2, 2.4 s: the last ones outlast the lease
    real_step, real_tick = scheduler.step, scheduler.tick
    ticks: list[dict[str, int]] = []

    def step() -> float:
        if outage["steps"]:
            outage["steps"] -= 1
            raise sa.exc.OperationalError("SELECT 1", None, ConnectionRefusedError("server down"))
        return real_step()

    def tick() -> dict[str, int]:
        changes = real_tick()
        ticks.append(changes)
        return changes

    monkeypatch.setattr(scheduler, "step", step)
    monkeypatch.setattr(scheduler, "tick", tick)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        reaped = wait_for(
            lambda: next((t["leases_reaped"] for t in ticks if t.get("leases_reaped")), None),
            timeout=60,
            message="the leases to be reaped once the hold ended",
        )
        assert reaped == 2
        assert "leases_reaped" not in ticks[0], "the first step after the outage reaped at once"
        assert "running" not in {_state(runner, run_id, t) for t in ("bounded", "plain")}
    finally:
        scheduler.stop()
        thread.join(timeout=30)
