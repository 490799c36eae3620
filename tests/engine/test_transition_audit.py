"""Every state change the engine writes is an edge of domain/transitions.py.

A trigger on PostgreSQL records each (old state, new state) of task instances and runs into an
audit table while a scenario drives every use case through the engine: claims, buffered starts,
completions, failures and retries, dead letters and their propagation, requeue, clear, cancel,
hand back, dispatch timeouts, lost leases, overrun deadlines and the sweep. Any change the table
does not list fails the test, and so does a use case the scenario stopped reaching.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.helpers.wait import wait_for
from treadle import dag, task
from treadle.domain.states import AttemptOutcome
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.domain.transitions import run_edges, task_edges
from treadle.engine import queries
from treadle.engine.cancellation import cancel_run, cancel_task
from treadle.engine.clearing import clear_tasks
from treadle.engine.dead_letters import requeue_dead_letter
from treadle.engine.execution import (
    claim_task_instances,
    complete_attempt,
    fail_attempt,
    hand_back_attempts,
    start_claimed,
)
from treadle.engine.reaper import (
    enforce_execution_deadlines,
    expire_dispatch_deadlines,
    promote_due_retries,
    reap_expired_leases,
)
from treadle.engine.runs import finish_idle_runs
from treadle.testing import DagRunner

pytestmark = pytest.mark.postgres

AUDIT = """
CREATE TABLE state_changes (entity text NOT NULL, old_state text NOT NULL, new_state text NOT NULL);
CREATE FUNCTION record_state_change() RETURNS trigger AS $$
BEGIN
  IF OLD.state IS DISTINCT FROM NEW.state THEN
    INSERT INTO state_changes VALUES (TG_TABLE_NAME, OLD.state, NEW.state);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER task_state_changes AFTER UPDATE ON task_instances
  FOR EACH ROW EXECUTE FUNCTION record_state_change();
CREATE TRIGGER run_state_changes AFTER UPDATE ON dag_runs
  FOR EACH ROW EXECUTE FUNCTION record_state_change();
"""


@task(retries=1, retry_delay=0)
def first() -> int:
    return 1


@task(retries=0)
def second(x: int) -> int:
    return x


@task(retries=1, retry_delay=0)
def side() -> None:
    return None


@task(retries=1, retry_delay=0, timeout=0.1)
def hurried() -> None:
    return None


@task(queue="nowhere", queue_timeout=0.1, retries=0)
def stranded() -> None:
    return None


@dag(dag_id="audited")
def audited() -> None:
    second(first())
    side()
    hurried()
    stranded()


@pytest.fixture
def runner(pg_url: str) -> Iterator[DagRunner]:
    r = DagRunner(audited, database_url=pg_url)
    with r.db.begin() as conn:
        conn.exec_driver_sql(AUDIT)
    yield r
    r.close()


def _claim(r: DagRunner, *, lease_s: float = 60, start: int | None = None) -> dict[str, ClaimedTask]:
    got = claim_task_instances(
        r.db, worker_id="w", hostname="h", queues=["default"], limit=10, lease_s=lease_s, start=start
    )
    return {t.task_id: t for t in got}


def _fail(r: DagRunner, attempt: ClaimedTask, *, retryable: bool = True) -> None:
    error = AttemptError(error_type="Boom", message="boom", retryable=retryable)
    assert fail_attempt(
        r.db, attempt, outcome=AttemptOutcome.FAILED, error=error, worker_id="w", hostname="h"
    ).applied


def _ok(r: DagRunner, attempt: ClaimedTask) -> None:
    assert complete_attempt(r.db, attempt, worker_id="w", hostname="h", value=1).applied


def _instance(r: DagRunner, run_id: str, task_id: str) -> int:
    return next(t.id for t in queries.run_detail(r.db, run_id).task_instances if t.task_id == task_id)


def _scenario(r: DagRunner) -> None:
    run_id = r.trigger()
    held = _claim(r, start=2)  # first, side started; hurried buffered
    assert held["hurried"].started_at is None
    started = start_claimed(r.db, held["hurried"], worker_id="w")
    assert started is not None
    _fail(r, held["first"])  # running -> retry_wait
    assert hand_back_attempts(r.db, [held["side"]], worker_id="w", hostname="h") == 1  # -> queued
    # hurried overruns its 0.1 s deadline while heartbeating, then its worker goes silent.
    wait_for(lambda: enforce_execution_deadlines(r.db, grace_s=0) == 1, timeout=10, message="overrun")
    wait_for(lambda: expire_dispatch_deadlines(r.db, worker_stale_s=30) == 1, timeout=10, message="dispatch")
    wait_for(lambda: promote_due_retries(r.db) >= 1, timeout=10, message="retries due")
    assert set(_claim(r, lease_s=0.2)) == {"first", "side", "hurried"}  # then their worker dies
    wait_for(lambda: reap_expired_leases(r.db) == 3, timeout=10, message="leases to lapse")  # lost
    wait_for(lambda: promote_due_retries(r.db) == 3, timeout=10, message="retries due")
    held = _claim(r)
    _ok(r, held["first"])  # readies second
    _ok(r, held["side"])
    _fail(r, held["hurried"], retryable=False)
    _fail(r, _claim(r)["second"], retryable=False)  # the last active instance: closes the run failed
    finish_idle_runs(r.db)
    assert queries.run_detail(r.db, run_id).run.state == "failed"
    requeue_dead_letter(r.db, _instance(r, run_id, "second"))  # failed -> running
    _ok(r, _claim(r)["second"])  # closes failed again: hurried and stranded are dead letters
    clear_tasks(r.db, run_id, ["stranded"], downstream=False, actor="op", reason="audit")
    cancel_task(r.db, run_id, "stranded", actor="op")

    other = r.trigger()
    _fail(r, _claim(r)["first"], retryable=False)  # second -> upstream_failed
    requeue_dead_letter(r.db, _instance(r, other, "first"))  # upstream_failed -> pending
    cancel_run(r.db, other, actor="op")
    clear_tasks(r.db, other, None, downstream=False, actor="op", reason="audit")  # cancelled -> running


def test_every_state_change_is_an_edge_of_the_state_machine(runner: DagRunner) -> None:
    _scenario(runner)

    with runner.db.read() as conn:
        seen = {(e, o, n) for e, o, n in conn.execute(sa.text("SELECT * FROM state_changes"))}
    tasks_seen = {(o, n) for e, o, n in seen if e == "task_instances"}
    runs_seen = {(o, n) for e, o, n in seen if e == "dag_runs"}
    assert tasks_seen - task_edges() == set(), "task transitions missing from domain/transitions.py"
    assert runs_seen - run_edges() == set(), "run transitions missing from domain/transitions.py"
    # The scenario still reaches every kind of change (a refactor that skips one would show here).
    assert {
        ("queued", "running"),
        ("pending", "queued"),
        ("running", "success"),
        ("running", "retry_wait"),
        ("running", "dead_letter"),
        ("running", "queued"),
        ("retry_wait", "queued"),
        ("queued", "dead_letter"),
        ("pending", "upstream_failed"),
        ("dead_letter", "queued"),
        ("upstream_failed", "pending"),
        ("cancelled", "pending"),
        ("pending", "cancelled"),
        ("queued", "cancelled"),
        ("cancelled", "queued"),
    } <= tasks_seen
    assert {
        ("running", "failed"),
        ("failed", "running"),
        ("running", "cancelled"),
        ("cancelled", "running"),
    } <= runs_seen
