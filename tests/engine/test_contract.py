"""A DAG's contract and params rules enforced by the engine, and the default task timeout stored on
task instances, on every database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from treadle import Param, ParamRule, dag, task
from treadle.engine import backfill_actions as bf
from treadle.engine import queries
from treadle.engine.backfill_drain import drain_backfills
from treadle.engine.clearing import clear_tasks
from treadle.engine.dags import sync_dags
from treadle.engine.execution import claim_task_instances, complete_attempts
from treadle.engine.leadership import Leadership
from treadle.engine.runs import trigger_run
from treadle.engine.scheduling import fire_due_schedules
from treadle.errors import ParamsInvalid, RunNotAllowed
from treadle.store.database import Database
from treadle.store.tables import audit_log, backfills, dag_runs, task_instances
from treadle.testing import DagRunner

START = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=2)


@task
def first() -> int:
    return 1


@task(timeout=90)
def second(n: int) -> int:
    return n + 1


def hourly(**contract: Any) -> Any:
    @dag(
        dag_id="guarded",
        owner="data-eng",
        schedule=timedelta(hours=1),
        start_date=START,
        max_active_runs=100,
        **contract,
    )
    def guarded() -> None:
        second(first())

    return guarded


def _register(db: Database, *dags: Any) -> None:
    sync_dags(db, structures=[d.structure() for d in dags], scanned_files=[], errors={})


def _count(db: Database, table: sa.Table) -> int:
    with db.read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _timeouts(db: Database, run_id: str) -> dict[str, float | None]:
    """Each task instance's stored timeout (seconds) in one run."""
    ti = task_instances.c
    with db.read() as conn:
        rows = conn.execute(sa.select(ti.task_id, ti.timeout_s).where(ti.run_id == run_id))
        return {r.task_id: None if r.timeout_s is None else float(r.timeout_s) for r in rows}


def _leader(db: Database) -> Leadership:
    leadership = Leadership(db, holder="test-leader", lease_s=60)
    assert leadership.refresh()
    return leadership


def test_a_dag_that_refuses_manual_runs_is_not_triggered_and_nothing_is_created(db: Database) -> None:
    _register(db, hourly(manual_runs=False))

    with pytest.raises(RunNotAllowed) as err:
        trigger_run(db, "guarded", triggered_by="cli:alice")

    assert (err.value.dag_id, err.value.setting, err.value.run_kind) == (
        "guarded",
        "manual_runs",
        "manual runs",
    )
    assert str(err.value) == (
        "DAG 'guarded' does not allow manual runs: its contract sets manual_runs=False; "
        "its owner is 'data-eng'"
    )
    assert _count(db, dag_runs) == 0 and _count(db, task_instances) == 0
    # Its schedule still runs it.
    leadership = _leader(db)
    assert leadership.epoch is not None
    report = fire_due_schedules(
        db, holder=leadership.holder, epoch=leadership.epoch, default_queue_timeout_s=60
    )
    assert report.runs_created >= 1


def test_treadle_testing_refuses_a_manual_run_too_but_runs_it_as_scheduled(db_url: str) -> None:
    runner = DagRunner(hourly(manual_runs=False), database_url=db_url)
    try:
        with pytest.raises(RunNotAllowed):
            runner.trigger()
        result = runner.run_until_done(runner.trigger(run_type="scheduled"))
        assert result.state == "success" and result.results["second"] == 2
        assert result.run.run_type == "scheduled"
    finally:
        runner.close()


def test_a_dag_that_refuses_backfills_gets_no_backfill_nor_plan(db: Database) -> None:
    _register(db, hourly(backfills=False))
    request: dict[str, Any] = {"from_date": START, "to_date": START + timedelta(hours=5), "reason": "reload"}

    for attempt in (
        lambda: bf.plan_backfill(db, "guarded", **request),
        lambda: bf.create_backfill(db, "guarded", requested_by="cli:alice", **request),
    ):
        with pytest.raises(RunNotAllowed) as err:
            attempt()
        assert err.value.setting == "backfills"
        assert "DAG 'guarded' does not allow backfills: its contract sets backfills=False" in str(err.value)

    assert _count(db, backfills) == 0 and _count(db, dag_runs) == 0 and _count(db, audit_log) == 0
    # Manual runs are still fine.
    trigger_run(db, "guarded", triggered_by="cli:alice")


def test_a_running_backfill_pauses_when_its_dag_stops_allowing_backfills(db: Database) -> None:
    allowed = hourly()
    _register(db, allowed)
    info = bf.create_backfill(
        db,
        "guarded",
        from_date=START,
        to_date=START + timedelta(hours=5),
        reason="reload",
        requested_by="cli:alice",
        max_active=2,
    )
    _register(db, hourly(backfills=False))
    leadership = _leader(db)
    assert leadership.epoch is not None

    handled = drain_backfills(
        db, holder=leadership.holder, epoch=leadership.epoch, default_queue_timeout_s=60
    )

    assert handled == 0 and _count(db, dag_runs) == 0
    status = bf.get_backfill(db, info.id).status
    assert status.backfill.state == "paused"
    with db.read() as conn:
        details = conn.execute(
            sa.select(audit_log.c.details).where(audit_log.c.action == "backfill.pause")
        ).scalar_one()
    assert details == {
        "reason": "DAG 'guarded' no longer allows backfills (its contract sets backfills=False)"
    }


RANGED = {
    "from_date": Param("2026-01-01", type="string", format="date"),
    "to_date": Param("2026-01-02", type="string", format="date"),
    "mode": Param("NORMAL", enum=["NORMAL", "BACKFILL"]),
    "reason": Param(None, type=["string", "null"]),
}


@dag(
    dag_id="ranged",
    params=RANGED,
    param_rules=[
        ParamRule.ordered("from_date", "to_date"),
        ParamRule.max_range("from_date", "to_date", days=31),
        ParamRule.requires("mode", "BACKFILL", "reason"),
    ],
)
def ranged() -> None:
    first()


def test_param_rules_are_checked_at_trigger_with_the_schema_and_nothing_is_created(db: Database) -> None:
    _register(db, ranged)

    with pytest.raises(ParamsInvalid) as err:
        trigger_run(
            db,
            "ranged",
            conf={"from_date": "2026-03-01", "to_date": "2026-01-01", "mode": "BACKFILL", "limit": 3},
            triggered_by="cli:alice",
        )

    assert [v.path for v in err.value.violations] == ["$.limit", "$.reason", "$.to_date"]
    assert _count(db, dag_runs) == 0
    with pytest.raises(
        ParamsInvalid, match=r"\$\.to_date: the range from 'from_date' to 'to_date' is 59 days"
    ):
        trigger_run(db, "ranged", conf={"from_date": "2026-01-01", "to_date": "2026-03-01"}, triggered_by="t")
    run = trigger_run(
        db,
        "ranged",
        conf={"from_date": "2026-01-01", "to_date": "2026-01-31", "mode": "BACKFILL", "reason": "fix #7"},
        triggered_by="t",
    )
    assert run.params is not None and run.params["reason"] == "fix #7"
    assert _count(db, dag_runs) == 1


def test_the_default_timeout_is_stored_on_instances_of_tasks_without_one(db: Database) -> None:
    _register(db, hourly())

    default = trigger_run(db, "guarded", triggered_by="t")
    assert _timeouts(db, default.run_id) == {"first": 24 * 3600.0, "second": 90.0}
    custom = trigger_run(db, "guarded", triggered_by="t", default_task_timeout_s=600)
    assert _timeouts(db, custom.run_id) == {"first": 600.0, "second": 90.0}
    off = trigger_run(db, "guarded", triggered_by="t", default_task_timeout_s=None)
    assert _timeouts(db, off.run_id) == {"first": None, "second": 90.0}

    leadership = _leader(db)
    assert leadership.epoch is not None
    report = fire_due_schedules(
        db,
        holder=leadership.holder,
        epoch=leadership.epoch,
        default_queue_timeout_s=60,
        default_task_timeout_s=1200,
    )
    assert report.created
    assert _timeouts(db, report.created[0].run_id) == {"first": 1200.0, "second": 90.0}

    # The version is the same whatever the default: it is not part of the DAG's structure.
    assert len({queries.run_detail(db, r.run_id).run.dag_version_id for r in (default, custom, off)}) == 1

    # A cleared task keeps the timeout its instance was created with.
    claimed = [
        t
        for t in claim_task_instances(
            db, worker_id="w", hostname="h", queues=["default"], limit=100, lease_s=60
        )
        if t.run_id == custom.run_id
    ]
    assert [t.task_id for t in claimed] == ["first"]
    assert claimed[0].timeout_s == 600  # what the worker enforces
    complete_attempts(db, [(claimed[0], 1)], worker_id="w", hostname="h")
    clear_tasks(db, custom.run_id, ["first"], downstream=False, actor="cli:alice", reason="again")
    assert _timeouts(db, custom.run_id) == {"first": 600.0, "second": 90.0}
