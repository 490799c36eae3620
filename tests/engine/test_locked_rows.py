"""A row some other session holds locked (a worker cut off mid-transaction: the server keeps its
locks until it ends the idle transaction) stalls only that row's own work, never the scheduler's
passes over the other rows. On PostgreSQL and MariaDB (SQLite has no row locks)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from tests.helpers.wait import wait_for
from treadle import dag, task
from treadle.domain.states import AttemptOutcome
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.engine import queries
from treadle.engine.execution import claim_task_instances, fail_attempt
from treadle.engine.reaper import promote_due_retries, reap_expired_leases
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now
from treadle.store.tables import task_instances
from treadle.testing import DagRunner


@task(retries=3, retry_delay=0)
def held() -> None:
    return None


@task(retries=3, retry_delay=0)
def retrying() -> None:
    return None


@dag(dag_id="locked_rows")
def locked_rows() -> None:
    held()
    retrying()


@pytest.fixture(
    params=[
        pytest.param("pg_url", marks=pytest.mark.postgres, id="postgresql"),
        pytest.param("mysql_url", marks=pytest.mark.mysql, id="mariadb"),
    ]
)
def runner(request: pytest.FixtureRequest) -> Iterator[DagRunner]:
    r = DagRunner(locked_rows, database_url=request.getfixturevalue(request.param))
    yield r
    r.close()


@contextmanager
def locked_elsewhere(runner: DagRunner, task_instance_id: int) -> Iterator[None]:
    """Hold the row locked from another session, as a client cut off mid-transaction would."""
    other = Database(runner.db.url)
    try:
        with other.engine.connect() as conn, conn.begin() as trans:
            rows = conn.execute(
                sa.select(task_instances.c.id)
                .where(task_instances.c.id == task_instance_id)
                .with_for_update()
            ).all()
            assert len(rows) == 1
            yield
            trans.rollback()
    finally:
        other.dispose()


def _claim_both(runner: DagRunner, *, lease_s: float) -> dict[str, ClaimedTask]:
    runner.trigger()
    claimed = claim_task_instances(
        runner.db, worker_id="w", hostname="h", queues=["default"], limit=2, lease_s=lease_s
    )
    assert sorted(t.task_id for t in claimed) == ["held", "retrying"]
    return {t.task_id: t for t in claimed}


def test_a_locked_row_does_not_stall_promoting_the_other_retries(runner: DagRunner) -> None:
    by_task = _claim_both(runner, lease_s=30)
    error = AttemptError(error_type="Boom", message="boom")
    fail_attempt(
        runner.db,
        by_task["retrying"],
        outcome=AttemptOutcome.FAILED,
        error=error,
        worker_id="w",
        hostname="h",
    )
    with locked_elsewhere(runner, by_task["held"].task_instance_id):
        began = time.monotonic()
        assert promote_due_retries(runner.db) == 1
        took = time.monotonic() - began
    # Waiting for the lock would have taken the lock timeout and its retries (or the server's
    # idle-transaction timeout); a generous bound still tells the two apart on a busy machine.
    assert took < 5, f"the pass waited {took:.1f} s on a row it does not promote"


def test_the_reaper_passes_over_a_locked_row_and_takes_it_once_free(runner: DagRunner) -> None:
    by_task = _claim_both(runner, lease_s=0.5)
    held_id = by_task["held"].task_instance_id
    reaped: list[int] = []

    def reap() -> bool:
        reaped.append(reap_expired_leases(runner.db))
        return sum(reaped) >= 1

    with locked_elsewhere(runner, held_id):  # both leases lapse meanwhile; only one is free
        wait_for(reap, timeout=30, message="the free row's lease to be reaped")
        assert sum(reaped) == 1
    wait_for(lambda: reap_expired_leases(runner.db) == 1, timeout=30, message="the freed row to be reaped")
    states = {
        t.task_id: t.state for t in queries.run_detail(runner.db, by_task["held"].run_id).task_instances
    }
    assert states == {"held": "retry_wait", "retrying": "retry_wait"}


def test_the_retry_promotion_locks_no_row_it_does_not_promote(runner: DagRunner) -> None:
    """A promotion pass with nothing due leaves a running attempt's row free for the rest of
    its transaction: its worker's renewal must not skip it (InnoDB's range scan reads, and
    locked, the index entry just past the waiting states: a running row)."""
    running = _claim_both(runner, lease_s=30)["held"]
    other = Database(runner.db.url)
    try:
        with runner.db.engine.connect() as conn, conn.begin():
            assert ti_store.promote_due_retries(conn, now=db_now(conn)) == 0
            with other.engine.connect() as elsewhere, elsewhere.begin():
                assert ti_store.lock_unless_held(elsewhere, running.task_instance_id)
    finally:
        other.dispose()
