"""Leases and fencing through the engine on SQLite and PostgreSQL (no processes needed)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from tests.helpers.wait import wait_for
from treadle import dag, task
from treadle.domain.states import AttemptOutcome
from treadle.domain.task_records import AttemptError
from treadle.engine import queries
from treadle.engine.execution import claim_task_instances, complete_attempt, extend_leases, fail_attempt
from treadle.engine.reaper import promote_due_retries, reap_expired_leases
from treadle.store import task_instances as ti_store
from treadle.store.database import db_now
from treadle.store.tables import task_instances
from treadle.testing import DagRunner


@task(retries=5, retry_delay=0)
def work() -> str:
    return "done"


@dag(dag_id="single")
def single() -> None:
    work()


@task(priority_weight=10)
def urgent() -> None:
    return None


@task(queue="other")
def elsewhere() -> None:
    return None


@dag(dag_id="wide")
def wide() -> None:
    for _ in range(5):
        work()
    urgent()
    elsewhere()


@pytest.fixture
def runner(db_url: str) -> Iterator[DagRunner]:
    r = DagRunner(single, database_url=db_url)
    yield r
    r.close()


def _claim(runner: DagRunner, worker: str, *, lease_s: float = 30.0, limit: int = 1):  # type: ignore[no-untyped-def]
    return claim_task_instances(
        runner.db, worker_id=worker, hostname="h", queues=["default"], limit=limit, lease_s=lease_s
    )


def _reap_one(runner: DagRunner) -> None:
    wait_for(lambda: reap_expired_leases(runner.db) == 1, timeout=10, message="lease to expire")


def test_late_completion_from_a_lost_worker_is_discarded(runner: DagRunner) -> None:
    run_id = runner.trigger()
    [stale] = _claim(runner, "worker-a", lease_s=0.05)
    _reap_one(runner)

    ending = complete_attempt(runner.db, stale, worker_id="worker-a", hostname="h", value="zombie")

    assert not ending.applied
    detail = queries.run_detail(runner.db, run_id)
    [attempt] = detail.attempts
    assert (attempt.outcome, attempt.late_result) == ("lost", "late success discarded")
    assert detail.task_instances[0].state == "retry_wait"
    assert detail.results == {}

    promote_due_retries(runner.db)
    [fresh] = _claim(runner, "worker-b")
    assert fresh.attempt == 2
    assert complete_attempt(runner.db, fresh, worker_id="worker-b", hostname="h", value="ok").applied
    # The zombie cannot fail the new attempt either: its fence (attempt 1) no longer matches.
    late_fail = fail_attempt(
        runner.db,
        stale,
        outcome=AttemptOutcome.FAILED,
        error=AttemptError(error_type="E", message="late"),
        worker_id="worker-a",
        hostname="h",
    )
    assert not late_fail.applied
    final = runner.run_until_done(run_id)
    assert final.state == "success"
    assert final.results == {"work": "ok"}


def test_three_lost_leases_dead_letter_as_poison(runner: DagRunner) -> None:
    run_id = runner.trigger()
    for _ in range(3):
        promote_due_retries(runner.db)
        _claim(runner, "crashy", lease_s=0.05)
        _reap_one(runner)

    detail = queries.run_detail(runner.db, run_id)
    ti = detail.task_instances[0]
    assert (ti.state, ti.dead_letter_reason, ti.orphaned_count) == ("dead_letter", "poison", 3)
    assert [a.outcome for a in detail.attempts] == ["lost"] * 3
    assert detail.run.state == "failed"


def test_heartbeat_keeps_a_lease_and_reports_lost_ones(runner: DagRunner) -> None:
    runner.trigger()
    [held] = _claim(runner, "w1", lease_s=0.05)
    pair = (held.task_instance_id, held.attempt)
    assert extend_leases(runner.db, worker_id="w1", held=[pair], lease_s=30) == ({pair}, set())
    assert reap_expired_leases(runner.db) == 0
    assert extend_leases(runner.db, worker_id="someone-else", held=[pair], lease_s=30) == (set(), set())


def test_heartbeat_skips_a_row_another_transaction_holds_and_renews_it_next_time(runner: DagRunner) -> None:
    if runner.db.is_sqlite:
        pytest.skip("SQLite has no row locks: its writer lock serialises the two")
    runner.trigger()
    [held] = _claim(runner, "w1", lease_s=30)
    pair = (held.task_instance_id, held.attempt)
    # Another transaction (the worker's dispatch pass, a cancel) holds the row meanwhile: the
    # renewal neither waits for it nor calls the attempt lost.
    with runner.db.engine.connect() as other, other.begin():
        other.execute(
            sa.select(task_instances.c.id).where(task_instances.c.id == pair[0]).with_for_update()
        ).all()
        began = time.monotonic()
        assert extend_leases(runner.db, worker_id="w1", held=[pair], lease_s=30) == (set(), {pair[0]})
        waited = time.monotonic() - began
    assert waited < 30, f"the renewal waited {waited:.1f} s for the row"
    assert extend_leases(runner.db, worker_id="w1", held=[pair], lease_s=30) == ({pair}, set())


def test_a_stale_workers_renewal_leaves_the_row_of_the_attempt_that_replaced_its_own(
    runner: DagRunner,
) -> None:
    if runner.db.is_sqlite:
        pytest.skip("SQLite has no row locks: its writer lock serialises the two")
    runner.trigger()
    [held] = _claim(runner, "w2", lease_s=30)
    pair = (held.task_instance_id, held.attempt)
    # w1 was cut off while it ran attempt 1 of this row; its renewal reaches the server late,
    # inside a transaction that stays open (a path that froze again). It renews nothing...
    with runner.db.engine.connect() as stale, stale.begin():
        now = db_now(stale)
        renewed, skipped = ti_store.extend_leases(
            stale, worker_id="w1", held=[(pair[0], pair[1] - 1)], now=now, lease_s=30
        )
        assert (renewed, skipped) == (set(), set())
        # ...and holds no lock that keeps w2 from renewing the attempt it runs.
        assert extend_leases(runner.db, worker_id="w2", held=[pair], lease_s=30) == ({pair}, set())


def test_claim_honours_limit_priority_and_queue(db_url: str) -> None:
    r = DagRunner(wide, database_url=db_url)
    try:
        r.trigger()
        first = claim_task_instances(
            r.db, worker_id="w", hostname="h", queues=["default"], limit=3, lease_s=30
        )
        assert len(first) == 3
        assert "urgent" in {t.task_id for t in first}  # highest priority is claimed first
        rest = claim_task_instances(
            r.db, worker_id="w", hostname="h", queues=["default"], limit=50, lease_s=30
        )
        assert len(rest) == 3
        assert "elsewhere" not in {t.task_id for t in first + rest}
        other = claim_task_instances(
            r.db, worker_id="w", hostname="h", queues=["other"], limit=50, lease_s=30
        )
        assert [t.task_id for t in other] == ["elsewhere"]
    finally:
        r.close()


def test_a_buffered_attempt_is_started_only_while_its_worker_still_holds_it(runner: DagRunner) -> None:
    from treadle.engine.cancellation import cancel_task
    from treadle.engine.execution import start_claimed

    run_id = runner.trigger()
    [buffered] = claim_task_instances(
        runner.db, worker_id="worker-a", hostname="h", queues=["default"], limit=1, lease_s=30, start=0
    )
    assert buffered.started_at is None
    # Another worker id cannot start it; its own worker can, once.
    assert start_claimed(runner.db, buffered, worker_id="worker-b") is None
    started = start_claimed(runner.db, buffered, worker_id="worker-a")
    assert started is not None and started.started_at is not None
    assert start_claimed(runner.db, buffered, worker_id="worker-a") is None

    run_id = runner.trigger()
    [waiting] = [
        t
        for t in claim_task_instances(
            runner.db, worker_id="worker-a", hostname="h", queues=["default"], limit=1, lease_s=30, start=0
        )
        if t.run_id == run_id
    ]
    cancel_task(runner.db, run_id, "work", actor="op")
    assert start_claimed(runner.db, waiting, worker_id="worker-a") is None  # cancelled while buffered


def test_a_buffered_attempt_is_not_timed_out_before_it_starts(db_url: str) -> None:
    from treadle.engine.execution import start_claimed
    from treadle.engine.reaper import enforce_execution_deadlines

    r = DagRunner(bounded_dag, database_url=db_url)
    try:
        r.trigger()
        [buffered] = claim_task_instances(
            r.db, worker_id="w", hostname="h", queues=["default"], limit=1, lease_s=30, start=0
        )

        def times() -> tuple[datetime | None, datetime | None]:
            with r.db.read() as conn:
                row = conn.execute(sa.select(task_instances.c.started_at, task_instances.c.timeout_at)).one()
            return row.started_at, row.timeout_at

        assert times() == (None, None)  # the execution deadline starts at dispatch
        claimed_at = buffered_claim_time(r)
        wait_for(
            lambda: db_clock(r) > claimed_at + timedelta(seconds=0.5), timeout=10, message="0.5 s to pass"
        )
        assert enforce_execution_deadlines(r.db, grace_s=0) == 0
        assert start_claimed(r.db, buffered, worker_id="w") is not None
        started_at, timeout_at = times()
        assert started_at is not None and timeout_at is not None
        assert started_at > claimed_at + timedelta(seconds=0.5)
        assert abs((timeout_at - started_at).total_seconds() - 0.2) < 0.01
    finally:
        r.close()


@task(timeout=0.2)
def quick() -> None:
    return None


@dag(dag_id="bounded_dag")
def bounded_dag() -> None:
    quick()


def db_clock(r: DagRunner) -> datetime:
    with r.db.read() as conn:
        return db_now(conn)


def buffered_claim_time(r: DagRunner) -> datetime:
    with r.db.read() as conn:
        value: datetime = conn.execute(sa.select(task_instances.c.heartbeat_at)).scalar_one()
    return value
