"""Backfills: validated requests, a dry-run plan, and the leader's fenced drain under max_active."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from tests.engine.dags_for_tests import four_steps
from treadle import dag, task
from treadle.domain.backfill_plan import BackfillPlan
from treadle.domain.params import resolve_params
from treadle.domain.records import RunInfo
from treadle.domain.states import AttemptOutcome, RunType
from treadle.domain.task_records import AttemptError
from treadle.engine import backfill_actions as bf
from treadle.engine.backfill_drain import drain_backfills
from treadle.engine.dags import sync_dags
from treadle.engine.execution import claim_task_instances, complete_attempts, fail_attempt
from treadle.engine.leadership import Leadership
from treadle.engine.runs import new_run
from treadle.engine.scheduling import fire_due_schedules
from treadle.engine.versions import version_of
from treadle.errors import DagNotFound, InvalidRequest, NotLeader
from treadle.store import dags as dag_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.backfills import BackfillInfo
from treadle.store.database import Database, db_now
from treadle.store.tables import audit_log, backfills, dag_runs

HOUR = timedelta(hours=1)
#: Start date of the hourly test DAG: whole hours, three days ago.
START = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=3)


@task
def extract() -> int:
    return 1


@task
def load(n: int) -> int:
    return n


@dag(dag_id="hourly", schedule=timedelta(hours=1), start_date=START, max_active_runs=4)
def hourly() -> None:
    load(extract())


@dag(dag_id="by_dataset", schedule=["warehouse.orders"])
def by_dataset() -> None:
    extract()


@dag(dag_id="every_second", schedule=timedelta(seconds=1), start_date=START)
def every_second() -> None:
    extract()


def _register(db: Database, *dags: Any) -> None:
    sync_dags(db, structures=[d.structure() for d in dags], scanned_files=[], errors={})


def _k(n: int) -> datetime:
    """Logical date of the hourly DAG's n-th interval."""
    return START + n * HOUR


def _create(db: Database, **kw: Any) -> BackfillInfo:
    args: dict[str, Any] = {
        "from_date": _k(1),
        "to_date": _k(10),
        "reason": "orders table reloaded",
        "requested_by": "cli:alice",
        "max_active": 3,
        "max_span_days": 366,
    }
    args.update(kw)
    return bf.create_backfill(db, "hourly", **args)


def _plan(db: Database, **kw: Any) -> BackfillPlan:
    args: dict[str, Any] = {"from_date": _k(1), "to_date": _k(10), "reason": "r", "max_active": 3}
    args.update(kw)
    return bf.plan_backfill(db, "hourly", **args)


def _count(db: Database, table: sa.Table) -> int:
    with db.read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _runs(db: Database) -> list[RunInfo]:
    with db.read() as conn:
        rows = conn.execute(sa.select(dag_runs).order_by(dag_runs.c.logical_date, dag_runs.c.created_at))
        return [RunInfo(**r._mapping) for r in rows]


def _scheduled_run(db: Database, n: int) -> str:
    """Insert a scheduled run of the hourly DAG's n-th interval (as the scheduler would)."""

    def work(conn: Any) -> str:
        dag_info = dag_store.get_dag(conn, "hourly")
        assert dag_info is not None and dag_info.latest_version_id is not None
        version = version_of(db, conn, dag_info.latest_version_id)
        now = db_now(conn)
        run, rows = new_run(
            version,
            run_type=RunType.SCHEDULED,
            logical_date=_k(n),
            data_interval=(_k(n), _k(n + 1)),
            conf={},
            params=resolve_params("hourly", None, {}),
            triggered_by="scheduler",
            now=now,
            default_queue_timeout_s=600,
        )
        run_store.insert_run(conn, run)
        ti_store.insert_task_instances(conn, rows)
        return run.run_id

    return db.transact(work)


def _finish_all(db: Database) -> None:
    """Run every queued task instance to success (a worker that runs no user code)."""
    while True:
        claimed = claim_task_instances(
            db, worker_id="w", hostname="h", queues=["default"], limit=100, lease_s=60
        )
        if not claimed:
            return
        complete_attempts(db, [(t, 1) for t in claimed], worker_id="w", hostname="h")


def _fail_root(db: Database) -> None:
    """Dead-letter the one queued root task (non-retryable): its run fails."""
    claimed = claim_task_instances(db, worker_id="w", hostname="h", queues=["default"], limit=1, lease_s=60)
    assert len(claimed) == 1
    error = AttemptError(error_type="ValueError", message="bad input", retryable=False)
    fail_attempt(db, claimed[0], outcome=AttemptOutcome.FAILED, error=error, worker_id="w", hostname="h")


def _leader(db: Database, holder: str = "s1", lease_s: float = 60) -> Leadership:
    leadership = Leadership(db, holder=holder, lease_s=lease_s)
    assert leadership.refresh()
    return leadership


def _drain(db: Database, leadership: Leadership) -> int:
    assert leadership.epoch is not None
    return drain_backfills(db, holder=leadership.holder, epoch=leadership.epoch, default_queue_timeout_s=600)


def _state(db: Database, backfill_id: int) -> bf.BackfillStatus:
    return bf.get_backfill(db, backfill_id).status


# -- validation ------------------------------------------------------------------------------------------


def test_invalid_requests_are_refused_and_record_nothing(db: Database) -> None:
    _register(db, hourly, four_steps, by_dataset, every_second)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"from_date": _k(5), "to_date": _k(2)}, "is after --to"),
        (
            {"to_date": _k(50), "max_span_days": 1},
            r"more than the limit of 1 days \(setting TREADLE_BACKFILL_MAX_SPAN_DAYS\)",
        ),
        ({"reason": ""}, r"needs a reason \(--reason TEXT\)"),
        ({"reason": "   "}, "needs a reason"),
        ({"max_active": 0}, r"--max-active must be between 1 and the DAG's max_active_runs \(4\), got 0"),
        ({"max_active": 5}, r"max_active_runs \(4\), got 5"),
        ({"mode": "loud"}, "mode must be one of normal, shadow"),
        ({"rerun": "some"}, "rerun must be one of none, failed, all"),
        (
            {"from_date": START - 10 * HOUR, "to_date": START - 2 * HOUR},
            "no interval of DAG 'hourly'.*schedule starts",
        ),
        ({"from_date": "2020-13-01"}, "--from '2020-13-01' is not an ISO-8601"),
        (
            {
                "from_date": datetime.now(UTC) + timedelta(days=1),
                "to_date": datetime.now(UTC) + timedelta(days=2),
            },
            "and has ended",
        ),
    ]
    for kw, message in cases:
        with pytest.raises(InvalidRequest, match=message):
            _create(db, **kw)
        with pytest.raises(InvalidRequest, match=message):
            _plan(db, **kw)
    with pytest.raises(
        InvalidRequest, match="DAG 'four_steps' has no schedule; a backfill needs a cron or interval"
    ):
        bf.create_backfill(db, "four_steps", from_date=_k(1), to_date=_k(2), reason="r", requested_by="a")
    with pytest.raises(InvalidRequest, match="has a dataset schedule"):
        bf.create_backfill(db, "by_dataset", from_date=_k(1), to_date=_k(2), reason="r", requested_by="a")
    with pytest.raises(DagNotFound, match="no DAG 'nope'"):
        bf.create_backfill(db, "nope", from_date=_k(1), to_date=_k(2), reason="r", requested_by="a")
    with pytest.raises(InvalidRequest, match="more than 10000 intervals"):
        bf.create_backfill(db, "every_second", from_date=_k(1), to_date=_k(4), reason="r", requested_by="a")
    assert _count(db, backfills) == 0
    assert _count(db, dag_runs) == 0
    with db.read() as conn:
        assert (
            conn.execute(sa.select(audit_log).where(audit_log.c.action == "backfill.create")).first() is None
        )


def test_naive_dates_are_read_in_the_schedule_time_zone_and_create_records_an_audit_entry(
    db: Database,
) -> None:
    _register(db, hourly)
    text_from = _k(1).strftime("%Y-%m-%dT%H:%M:%S")  # naive: the DAG's zone is UTC
    info = _create(db, from_date=text_from, to_date=_k(10).isoformat(), mode="shadow")
    assert info.from_date == _k(1) and info.to_date == _k(10)
    assert (info.state, info.total, info.handled, info.cursor) == ("running", 10, 0, _k(2))
    assert (info.mode, info.rerun, info.max_active, info.requested_by) == ("shadow", "none", 3, "cli:alice")
    with db.read() as conn:
        entry = conn.execute(sa.select(audit_log).where(audit_log.c.action == "backfill.create")).one()
    assert entry.actor == "cli:alice" and entry.target == f"backfill:{info.id}"
    assert entry.details["reason"] == "orders table reloaded" and entry.details["total"] == 10
    # Defaults: max_active is the DAG's max_active_runs.
    assert _create(db, max_active=None).max_active == 4


def test_dry_run_shows_each_interval_and_what_would_happen(db: Database) -> None:
    _register(db, hourly)
    ok = _scheduled_run(db, 3)
    _finish_all(db)
    failed = _scheduled_run(db, 5)
    _fail_root(db)
    plan = bf.plan_backfill(db, "hourly", from_date=_k(1), to_date=_k(6), reason="r", rerun="failed")
    assert plan.total == 6
    assert [i.logical_date for i in plan.intervals] == [_k(n) for n in range(1, 7)]
    assert all(i.data_interval_end == i.logical_date + HOUR == i.fire_at for i in plan.intervals)
    actions = {i.logical_date: (i.action, i.existing_run_id, i.existing_state) for i in plan.intervals}
    assert actions[_k(3)] == ("skip existing", ok, "success")
    assert actions[_k(5)] == ("rerun failed", failed, "failed")
    assert actions[_k(1)] == ("create", None, None)
    assert plan.actions == {"create": 4, "skip existing": 1, "rerun failed": 1}
    plan_all = bf.plan_backfill(db, "hourly", from_date=_k(1), to_date=_k(6), reason="r", rerun="all")
    assert plan_all.actions == {"create": 4, "rerun all": 2}
    assert _count(db, backfills) == 0


# -- drain -----------------------------------------------------------------------------------------------


def test_drain_keeps_max_active_runs_oldest_first_skips_existing_and_finishes(db: Database) -> None:
    _register(db, hourly)
    existing = _scheduled_run(db, 4)
    _finish_all(db)
    leader = _leader(db)
    info = _create(db)

    passes: list[list[datetime]] = []
    for _ in range(20):
        _drain(db, leader)
        runs = [r for r in _runs(db) if r.backfill_id == info.id]
        active = [r for r in runs if r.state in ("queued", "running")]
        assert len(active) <= 3
        passes.append(sorted(r.logical_date for r in active))
        if _state(db, info.id).backfill.state == "done":
            break
        _finish_all(db)
    status = _state(db, info.id)
    assert status.backfill.state == "done" and status.backfill.ended_at is not None
    assert (status.backfill.handled, status.backfill.cursor) == (10, None)
    assert (status.runs_success, status.runs_failed, status.runs_active, status.skipped) == (9, 0, 0, 1)
    # Three at a time, oldest first; the interval with a scheduled run is skipped.
    assert passes[:4] == [
        [_k(1), _k(2), _k(3)],
        [_k(5), _k(6), _k(7)],
        [_k(8), _k(9), _k(10)],
        [],
    ]
    runs = _runs(db)
    assert [r.logical_date for r in runs] == [_k(n) for n in range(1, 11)]  # one run per interval
    by_date = {r.logical_date: r for r in runs}
    assert by_date[_k(4)].run_id == existing and by_date[_k(4)].backfill_id is None
    backfill_runs = [r for r in runs if r.run_type == "backfill"]
    assert len(backfill_runs) == 9
    for r in backfill_runs:
        assert (r.backfill_id, r.mode, r.leader_epoch, r.params) == (info.id, "normal", leader.epoch, {})
        assert r.triggered_by == f"backfill:{info.id}:cli:alice"
        assert (r.data_interval_start, r.data_interval_end) == (r.logical_date, r.logical_date + HOUR)
        assert r.manifest is not None and r.manifest["backfill_id"] == info.id
    assert _drain(db, leader) == 0  # a done backfill is left alone


def test_rerun_failed_clears_the_failed_run_and_counts_it_against_the_backfill(db: Database) -> None:
    _register(db, hourly)
    failed = _scheduled_run(db, 2)
    _fail_root(db)
    good = _scheduled_run(db, 3)
    _finish_all(db)
    leader = _leader(db)
    info = _create(db, from_date=_k(1), to_date=_k(3), rerun="failed")

    assert _drain(db, leader) == 3
    runs = {r.logical_date: r for r in _runs(db)}
    assert runs[_k(2)].run_id == failed
    assert (runs[_k(2)].state, runs[_k(2)].backfill_id, runs[_k(2)].ended_at) == ("running", info.id, None)
    assert runs[_k(3)].run_id == good and runs[_k(3)].backfill_id is None
    assert runs[_k(1)].run_type == "backfill"
    assert _state(db, info.id).runs_active == 2
    with db.read() as conn:
        entry = conn.execute(sa.select(audit_log).where(audit_log.c.action == "task.clear")).one()
    assert entry.target == f"run:{failed}" and entry.details["only_failed"] is True
    assert entry.details["tasks"] == ["extract", "load"]

    _finish_all(db)
    _drain(db, leader)
    status = _state(db, info.id)
    assert status.backfill.state == "done"
    assert (status.runs_success, status.skipped) == (2, 1)
    assert len(_runs(db)) == 3
    assert {r.state for r in _runs(db)} == {"success"}


def test_stale_epoch_raises_not_leader_and_creates_nothing(db: Database) -> None:
    _register(db, hourly)
    old = _leader(db, "s1", lease_s=0.5)
    info = _create(db)
    time.sleep(0.7)
    new = _leader(db, "s2")
    assert new.epoch != old.epoch
    with pytest.raises(NotLeader):
        _drain(db, old)
    assert _count(db, dag_runs) == 0
    assert _state(db, info.id).backfill.handled == 0
    assert _drain(db, new) == 3


def test_pause_cancel_and_paused_dag_stop_new_runs(db: Database) -> None:
    _register(db, hourly)
    leader = _leader(db)
    info = _create(db, max_active=2)
    assert _drain(db, leader) == 2

    assert bf.set_backfill_paused(db, info.id, paused=True, actor="cli:bob")
    assert not bf.set_backfill_paused(db, info.id, paused=True, actor="cli:bob")
    _finish_all(db)
    assert _drain(db, leader) == 0
    assert _state(db, info.id).backfill.state == "paused"
    assert bf.set_backfill_paused(db, info.id, paused=False, actor="cli:bob")

    with db.begin() as conn:
        dag_store.set_paused(conn, "hourly", paused=True, now=db_now(conn))
    assert _drain(db, leader) == 0
    with db.begin() as conn:
        dag_store.set_paused(conn, "hourly", paused=False, now=db_now(conn))
    assert _drain(db, leader) == 2

    done = bf.cancel_backfill(db, info.id, actor="cli:bob", reason="wrong range")
    assert done.changed and len(done.runs_cancelled) == 2
    status = _state(db, info.id)
    assert status.backfill.state == "cancelled" and status.backfill.ended_at is not None
    assert (status.runs_success, status.runs_cancelled, status.runs_active) == (2, 2, 0)
    assert _drain(db, leader) == 0
    assert len(_runs(db)) == 4
    with pytest.raises(InvalidRequest, match="has ended"):
        bf.set_backfill_paused(db, info.id, paused=False, actor="cli:bob")
    assert not bf.cancel_backfill(db, info.id, actor="cli:bob").changed
    with pytest.raises(InvalidRequest, match="no backfill 999"):
        bf.get_backfill(db, 999)
    with db.read() as conn:
        actions = [r.action for r in conn.execute(sa.select(audit_log).order_by(audit_log.c.id))]
    assert actions == [
        "backfill.create",
        "backfill.pause",
        "backfill.unpause",
        "backfill.cancel",
        "run.cancelled",
        "run.cancelled",
    ]
    listed = bf.list_backfills(db, dag_id="hourly")
    assert [s.backfill.id for s in listed] == [info.id]
    assert bf.list_backfills(db, dag_id="other") == []


def test_backfill_runs_do_not_hold_up_scheduled_runs(db: Database) -> None:
    _register(db, hourly)
    leader = _leader(db)
    _create(db, max_active=4)
    assert _drain(db, leader) == 4  # the DAG's max_active_runs (4) worth of backfill runs
    assert leader.epoch is not None
    report = fire_due_schedules(db, holder="s1", epoch=leader.epoch, default_queue_timeout_s=600)
    assert report.runs_created == 1 and report.blocked == 0


def test_rerun_all_reopens_a_successful_run(db: Database) -> None:
    _register(db, hourly)
    ok = _scheduled_run(db, 1)
    _finish_all(db)
    leader = _leader(db)
    info = _create(db, from_date=_k(1), to_date=_k(1), rerun="all")
    assert _drain(db, leader) == 1
    [run] = _runs(db)
    assert (run.run_id, run.state, run.backfill_id) == (ok, "running", info.id)
    _finish_all(db)
    _drain(db, leader)
    status = _state(db, info.id)
    assert (status.backfill.state, status.runs_success, status.skipped) == ("done", 1, 0)


NY_START = (datetime.now(UTC) - timedelta(days=6)).strftime("%Y-%m-%d")


@dag(dag_id="nightly_ny", schedule="0 2 * * *", timezone="America/New_York", start_date=NY_START)
def nightly_ny() -> None:
    extract()


def test_cron_dates_are_read_in_the_schedule_time_zone(db: Database) -> None:
    _register(db, nightly_ny)
    day = (datetime.now(UTC) - timedelta(days=4)).date()
    plan = bf.plan_backfill(
        db, "nightly_ny", from_date=day.isoformat(), to_date=f"{day.isoformat()}T23:59", reason="r"
    )
    [interval] = plan.intervals
    local = interval.logical_date.astimezone(ZoneInfo("America/New_York"))
    assert (local.date(), local.hour, local.minute) == (day, 2, 0)
    assert interval.data_interval_end - interval.logical_date in (
        timedelta(hours=23),
        timedelta(hours=24),
        timedelta(hours=25),
    )
    assert plan.max_active == 16  # the DAG's max_active_runs by default
