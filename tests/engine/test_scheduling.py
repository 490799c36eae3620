"""Schedules fired by the leader: catch-up, max_active_runs, pause, fencing, params, manifests."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Connection

from treadle import Param, TaskContext, dag, task
from treadle.domain.records import RunInfo
from treadle.domain.states import RunState
from treadle.domain.transitions import UseCase
from treadle.engine import queries
from treadle.engine.dags import sync_dags
from treadle.engine.leadership import Leadership
from treadle.engine.pausing import set_paused
from treadle.engine.runs import trigger_run
from treadle.engine.scheduling import fire_due_schedules
from treadle.errors import NotLeader, ParamsInvalid
from treadle.store import runs as run_store
from treadle.store import schedules as schedule_store
from treadle.store.database import Database, db_now
from treadle.testing import run_dag


@task
def noop() -> int:
    return 1


def _now(db: Database) -> datetime:
    return db.query(db_now)


def _hourly(start: datetime, *, catchup: bool, max_active_runs: int = 16) -> Any:
    @dag(
        dag_id="hourly",
        schedule=timedelta(hours=1),
        start_date=start,
        catchup=catchup,
        max_active_runs=max_active_runs,
    )
    def hourly() -> None:
        noop()

    return hourly


def _leader(db: Database, holder: str = "test-leader") -> Leadership:
    leadership = Leadership(db, holder=holder, lease_s=60)
    assert leadership.refresh()
    return leadership


def _fire(db: Database, leadership: Leadership) -> list[RunInfo]:
    assert leadership.epoch is not None
    report = fire_due_schedules(
        db, holder=leadership.holder, epoch=leadership.epoch, default_queue_timeout_s=60
    )
    return sorted(report.created, key=lambda r: r.logical_date)


def _finish(db: Database, runs: list[RunInfo]) -> None:
    def work(conn: Connection) -> None:
        now = db_now(conn)
        for r in runs:
            assert run_store.set_run_state(
                conn, r.run_id, by=UseCase.CLOSE, expected=RunState.RUNNING, new=RunState.SUCCESS, now=now
            )

    db.transact(work)


def _active_scheduled(db: Database) -> int:
    return sum(
        1
        for r in queries.list_runs(db, limit=1000)
        if r.run_type == "scheduled" and r.state in ("queued", "running")
    )


def test_catchup_creates_every_missed_interval_oldest_first_within_max_active_runs(db: Database) -> None:
    start = _now(db).replace(minute=0, second=0, microsecond=0) - timedelta(hours=10)
    sync_dags(
        db,
        structures=[_hourly(start, catchup=True, max_active_runs=3).structure()],
        scanned_files=[],
        errors={},
    )
    leadership = _leader(db)

    created: list[RunInfo] = []
    for _ in range(10):
        batch = _fire(db, leadership)
        assert _active_scheduled(db) <= 3
        assert _fire(db, leadership) == []  # held back while 3 are active
        created.extend(batch)
        _finish(db, batch)
        if not batch:
            break

    expected = [start + timedelta(hours=h) for h in range(10)]
    assert [r.logical_date for r in created] == expected
    assert [r.data_interval_end for r in created] == [d + timedelta(hours=1) for d in expected]
    assert all(r.leader_epoch == leadership.epoch for r in created)
    # Exactly one run per interval in the database, nothing more to fire.
    runs = [r for r in queries.list_runs(db, limit=1000) if r.run_type == "scheduled"]
    assert sorted(r.logical_date for r in runs) == expected
    assert _fire(db, leadership) == []


def test_catchup_off_runs_only_the_latest_interval(db: Database) -> None:
    start = _now(db).replace(minute=0, second=0, microsecond=0) - timedelta(hours=10)
    sync_dags(db, structures=[_hourly(start, catchup=False).structure()], scanned_files=[], errors={})
    leadership = _leader(db)

    assert leadership.epoch is not None
    report = fire_due_schedules(
        db, holder=leadership.holder, epoch=leadership.epoch, default_queue_timeout_s=60
    )
    assert [r.logical_date for r in report.created] == [start + timedelta(hours=9)]
    assert report.slots_skipped == 9
    assert _fire(db, leadership) == []


def test_paused_dag_creates_nothing_and_unpausing_without_catchup_creates_only_the_latest(
    db: Database,
) -> None:
    start = _now(db).replace(minute=0, second=0, microsecond=0) - timedelta(hours=5)
    sync_dags(db, structures=[_hourly(start, catchup=False).structure()], scanned_files=[], errors={})
    assert set_paused(db, "hourly", paused=True, actor="test")
    leadership = _leader(db)
    assert _fire(db, leadership) == []
    assert queries.list_runs(db) == []

    assert set_paused(db, "hourly", paused=False, actor="test")
    created = _fire(db, leadership)
    assert [r.logical_date for r in created] == [start + timedelta(hours=4)]


def test_a_stale_epoch_cannot_create_runs(db: Database) -> None:
    start = _now(db).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    sync_dags(db, structures=[_hourly(start, catchup=True).structure()], scanned_files=[], errors={})
    old = _leader(db, "old-leader")
    assert old.epoch is not None
    stale_epoch = old.epoch
    old.resign()
    new = _leader(db, "new-leader")
    assert new.epoch == stale_epoch + 1

    with pytest.raises(NotLeader):
        fire_due_schedules(db, holder="old-leader", epoch=stale_epoch, default_queue_timeout_s=60)
    assert queries.list_runs(db) == []
    # A standby cannot take a live lease.
    assert not Leadership(db, holder="standby", lease_s=60).refresh()
    assert len(_fire(db, new)) == 3


def test_lease_is_taken_over_only_after_it_lapses_on_the_database_clock(db: Database) -> None:
    first = Leadership(db, holder="first", lease_s=0.5)
    assert first.refresh()
    second = Leadership(db, holder="second", lease_s=0.5)
    assert not second.refresh()
    deadline = _now(db) + timedelta(seconds=5)
    while not second.refresh():
        assert _now(db) < deadline
    assert second.epoch == (first.epoch or 0) + 1
    # The old holder's renewal with its stale epoch fails: it must step down.
    assert not first.refresh()
    assert not first.is_leader()


def test_a_round_trip_too_long_to_bound_the_skew_never_refuses_leadership(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    # A limit of a microsecond allows round trips of a quarter of that: no real read is that
    # fast, so the skew is never measured, and an unmeasured skew must not cost leadership.
    leadership = Leadership(db, holder="slow-reader", lease_s=60, max_skew_s=1e-6)
    with caplog.at_level(logging.WARNING, logger="treadle.scheduler"):
        assert leadership.refresh()
        assert leadership.refresh()
    assert not leadership.skew_too_large
    unmeasured = [r for r in caplog.records if getattr(r, "event", None) == "scheduler.skew_unmeasured"]
    assert len(unmeasured) == 2
    assert all(getattr(r, "round_trip_s", None) is not None for r in unmeasured)


def test_a_measured_skew_within_the_limit_is_recorded(db: Database) -> None:
    leadership = Leadership(db, holder="measured", lease_s=60, max_skew_s=30.0)
    assert leadership.refresh()
    # The test host and the database share a clock: within a second, even on SQLite's millisecond clock.
    assert abs(leadership.skew_s) < 1.0
    assert not leadership.skew_too_large


def test_a_changed_dag_keeps_its_watermark_and_never_refires_a_slot(db: Database) -> None:
    start = _now(db).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    sync_dags(db, structures=[_hourly(start, catchup=True).structure()], scanned_files=[], errors={})
    leadership = _leader(db)
    assert len(_fire(db, leadership)) == 2

    @dag(dag_id="hourly", schedule=timedelta(hours=1), start_date=start, catchup=True, description="v2")
    def hourly_v2() -> None:
        noop()

    sync_dags(db, structures=[hourly_v2.structure()], scanned_files=[], errors={})
    assert _fire(db, leadership) == []
    assert len(queries.list_runs(db)) == 2


def test_scheduled_runs_carry_interval_params_defaults_and_manifest(db: Database) -> None:
    start = _now(db).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)

    @dag(
        dag_id="with_params",
        schedule="@hourly",
        start_date=start,
        params={"limit": Param(10, type="integer", minimum=1), "region": "eu"},
    )
    def with_params() -> None:
        noop()

    sync_dags(db, structures=[with_params.structure()], scanned_files=[], errors={})
    (run,) = _fire(db, _leader(db))
    assert run.params == {"limit": 10, "region": "eu"}
    manifest = run.manifest
    assert manifest is not None
    assert manifest["run_id"] == run.run_id
    assert manifest["dag_id"] == "with_params"
    assert manifest["logical_date"] == start.isoformat()
    assert manifest["data_interval_start"] == start.isoformat()
    assert manifest["data_interval_end"] == (start + timedelta(hours=1)).isoformat()
    assert manifest["run_type"] == "scheduled"
    assert manifest["mode"] == "normal"
    assert manifest["params"] == {"limit": 10, "region": "eu"}
    assert manifest["triggered_by"] == "scheduler"
    assert len(manifest["dag_version_hash"]) == 64
    stored = queries.run_detail(db, run.run_id).run
    assert stored.manifest == manifest


@dag(
    dag_id="typed_params",
    params={
        "limit": Param(10, type="integer", minimum=1, description="rows per batch"),
        "region": Param("eu", enum=["eu", "us"]),
        "date": Param(type="string", format="date"),
    },
)
def typed_params() -> None:
    noop()


def test_invalid_conf_lists_every_violation_with_its_path_and_creates_nothing(db: Database) -> None:
    sync_dags(db, structures=[typed_params.structure()], scanned_files=[], errors={})
    with pytest.raises(ParamsInvalid) as caught:
        trigger_run(db, "typed_params", conf={"limit": 0, "region": "mars", "extra": 1}, triggered_by="t")
    paths = {v.path: v.message for v in caught.value.violations}
    assert set(paths) == {"$.limit", "$.region", "$.extra", "$.date"}
    assert "minimum" in paths["$.limit"]
    assert "mars" in paths["$.region"]
    assert "extra" in paths["$.extra"]
    assert "date" in paths["$.date"]
    for path in paths:
        assert path in str(caught.value)
    assert queries.list_runs(db) == []

    run = trigger_run(db, "typed_params", conf={"date": "2026-07-04"}, triggered_by="cli:alice")
    assert run.params == {"limit": 10, "region": "eu", "date": "2026-07-04"}
    assert run.conf == {"date": "2026-07-04"}
    assert run.manifest is not None and run.manifest["triggered_by"] == "cli:alice"


@task
def read_context(context: TaskContext) -> dict[str, Any]:
    import json
    import os
    from pathlib import Path

    path = context.manifest_path
    on_disk = json.loads(Path(path).read_text()) if path else None
    return {
        "params": context.params,
        "manifest": context.manifest,
        "file": on_disk,
        "env": os.environ.get("TREADLE_MANIFEST_FILE") == path,
    }


@dag(dag_id="context_reader", params={"n": 3})
def context_reader() -> None:
    read_context()


def test_params_and_manifest_reach_the_task_and_its_subprocesses(db_url: str) -> None:
    result = run_dag(context_reader, database_url=db_url, conf={"n": 5})
    seen = result.results["read_context"]
    assert seen["params"] == {"n": 5}
    assert seen["manifest"]["params"] == {"n": 5}
    assert seen["manifest"]["dag_id"] == "context_reader"
    assert seen["file"] == seen["manifest"]
    assert seen["env"] is True


def test_a_start_date_in_the_future_fires_nothing_yet(db: Database) -> None:
    future = datetime.now(UTC) + timedelta(days=1)
    sync_dags(db, structures=[_hourly(future, catchup=True).structure()], scanned_files=[], errors={})
    assert _fire(db, _leader(db)) == []


def test_a_slot_that_already_has_a_run_is_skipped_never_doubled(db: Database) -> None:
    """Even if a watermark went back (restored backup, lost update), the unique key holds."""
    start = _now(db).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    sync_dags(db, structures=[_hourly(start, catchup=True).structure()], scanned_files=[], errors={})
    leadership = _leader(db)
    first = _fire(db, leadership)
    assert len(first) == 3

    def rewind(conn: Connection) -> None:
        row = schedule_store.get(conn, "hourly")
        assert row is not None and row.next_fire_at is not None
        schedule_store.put(
            conn,
            "hourly",
            kind=row.kind,
            spec=row.spec,
            last_fire_at=None,
            next_fire_at=start + timedelta(hours=1),
            now=db_now(conn),
        )

    db.transact(rewind)
    assert leadership.epoch is not None
    report = fire_due_schedules(
        db, holder=leadership.holder, epoch=leadership.epoch, default_queue_timeout_s=60
    )
    assert report.runs_created == 0
    assert report.slots_skipped == 3
    assert sorted(r.logical_date for r in queries.list_runs(db)) == [r.logical_date for r in first]


def test_catchup_skips_an_interval_a_backfill_already_ran(db: Database) -> None:
    start = _now(db).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    sync_dags(db, structures=[_hourly(start, catchup=True).structure()], scanned_files=[], errors={})

    def backfilled(conn: Connection) -> None:
        from treadle.domain.states import RunType
        from treadle.engine.runs import new_run
        from treadle.engine.versions import version_of
        from treadle.store import dags as dag_store
        from treadle.store import task_instances as ti_store

        dag_info = dag_store.get_dag(conn, "hourly")
        assert dag_info is not None and dag_info.latest_version_id is not None
        now = db_now(conn)
        run, rows = new_run(
            version_of(db, conn, dag_info.latest_version_id),
            run_type=RunType.BACKFILL,
            logical_date=start + timedelta(hours=1),
            data_interval=(start + timedelta(hours=1), start + timedelta(hours=2)),
            conf={},
            params={},
            triggered_by="backfill:1:test",
            now=now,
            default_queue_timeout_s=60,
        )
        run_store.insert_run(conn, run)
        ti_store.insert_task_instances(conn, rows)

    db.transact(backfilled)
    created = _fire(db, _leader(db))
    assert [r.logical_date for r in created] == [start, start + timedelta(hours=2)]
