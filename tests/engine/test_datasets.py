"""Datasets: events recorded by producing tasks, and the runs they trigger for consumers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sqlalchemy.engine import Connection

from treadle import Dataset, TaskContext, dag, task
from treadle.domain.records import RunInfo
from treadle.domain.states import RunState, RunType
from treadle.domain.transitions import UseCase
from treadle.engine import queries
from treadle.engine.dags import sync_dags
from treadle.engine.datasets import (
    MAX_LISTED_EVENTS,
    dataset_events,
    list_datasets,
    record_outlet_events,
    trigger_dataset_runs,
)
from treadle.engine.execution import claim_task_instances, complete_attempts
from treadle.engine.leadership import Leadership
from treadle.engine.pausing import set_paused
from treadle.engine.runs import new_run
from treadle.engine.versions import version_of
from treadle.errors import InvalidRequest, NotLeader
from treadle.store import datasets as dataset_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now
from treadle.testing import DagRunner

A = Dataset("warehouse.a")
B = Dataset("warehouse.b")


@task(outlets=[A])
def produce_a(context: TaskContext) -> int:
    version = context.params.get("version")
    if version is not None:
        context.outlet_event(A, version=version, metadata={"rows": 120})
    return 1


@task(outlets=["warehouse.b"])
def produce_b() -> int:
    return 2


@dag(dag_id="producer")
def producer() -> None:
    produce_a()
    produce_b()


@task
def noop() -> int:
    return 0


def _consumer(*, max_active_runs: int = 16) -> Any:
    @dag(dag_id="consumer", schedule=[A, B], max_active_runs=max_active_runs)
    def consumer() -> None:
        noop()

    return consumer


def _register(db: Database, *dags: Any) -> None:
    sync_dags(db, structures=[d.structure() for d in dags], scanned_files=[], errors={})


def _leader(db: Database) -> Leadership:
    leadership = Leadership(db, holder="t", lease_s=30)
    assert leadership.refresh()
    return leadership


def _trigger(db: Database, lead: Leadership) -> int:
    assert lead.epoch is not None
    return trigger_dataset_runs(db, holder=lead.holder, epoch=lead.epoch, default_queue_timeout_s=60)


def _emit(db: Database, dataset: str, count: int = 1) -> None:
    """Record `count` events on `dataset` as a producing task would (one transaction each)."""
    for n in range(count):

        def work(conn: Connection, n: int = n) -> None:
            row = {
                "dataset": dataset,
                "run_id": f"manual__x{n}",
                "dag_id": "producer",
                "task_id": "emit",
                "version": f"v{n}",
                "extra": {"n": n},
                "created_at": db_now(conn),
            }
            record_outlet_events(conn, [row])

        db.transact(work)


def _dataset_runs(db: Database) -> list[RunInfo]:
    runs = [r for r in queries.list_runs(db, dag_id="consumer", limit=1000) if r.run_type == "dataset"]
    return sorted(runs, key=lambda r: r.created_at)


def _marks(db: Database) -> dict[str, int]:
    return db.query(lambda conn: dataset_store.consumer_marks(conn, ["consumer"])).get("consumer", {})


def _last_ids(db: Database) -> dict[str, int]:
    return db.query(lambda conn: dataset_store.last_event_ids(conn, [A.name, B.name]))


# -- recording ------------------------------------------------------------------------------------


def test_success_records_one_event_per_outlet_with_version_and_metadata(db_url: str) -> None:
    runner = DagRunner(producer, database_url=db_url)
    try:
        result = runner.run_until_done(runner.trigger({"version": "2026-07-04"}))
        assert result.state == "success"
        by_dataset = {e.dataset: e for e in result.dataset_events}
        assert sorted(by_dataset) == [A.name, B.name]
        a, b = by_dataset[A.name], by_dataset[B.name]
        assert (a.run_id, a.dag_id, a.task_id) == (result.run.run_id, "producer", "produce_a")
        assert (a.version, a.extra) == ("2026-07-04", {"rows": 120})
        assert (b.task_id, b.version, b.extra) == ("produce_b", None, {})

        second = runner.run_until_done(runner.trigger())
        assert len(second.dataset_events) == 2
        [newest, *_] = dataset_events(runner.db, A.name, limit=10)
        assert newest.run_id == second.run.run_id and newest.version is None
        assert _last_ids(runner.db)[A.name] == newest.id
        views = {v.name: v for v in list_datasets(runner.db)}
        assert views[A.name].events == 2
        assert views[A.name].producers == ("producer.produce_a",)
        assert views[B.name].last_event_id == max(e.id for e in second.dataset_events)
    finally:
        runner.close()


def test_shadow_run_records_no_dataset_events(db_url: str) -> None:
    runner = DagRunner(producer, database_url=db_url)
    try:

        def work(conn: Connection) -> str:
            info = queries.get_dag(runner.db, "producer")
            assert info is not None and info.latest_version_id is not None
            version = version_of(runner.db, conn, info.latest_version_id)
            now = db_now(conn)
            run, rows = new_run(
                version,
                run_type=RunType.BACKFILL,
                logical_date=now,
                data_interval=(now, now),
                conf={"version": "shadow"},
                params={"version": "shadow"},
                triggered_by="test",
                now=now,
                default_queue_timeout_s=60,
                mode="shadow",
            )
            run_store.insert_runs(conn, [run])
            ti_store.insert_task_instances(conn, rows)
            return run.run_id

        run_id = runner.db.transact(work)
        result = runner.run_until_done(run_id)
        assert result.state == "success"
        assert result.dataset_events == []
        assert list_datasets(runner.db)[0].events == 0  # declared by the producer, never recorded
    finally:
        runner.close()


def test_discarded_success_records_no_event(db: Database) -> None:
    _register(db, producer)
    runner = DagRunner(producer, database_url=db.url)
    try:
        runner.trigger()
        claimed = claim_task_instances(
            db, worker_id="w1", hostname="h", queues=["default"], limit=5, lease_s=60
        )
        assert len(claimed) == 2
        # Another worker's report of these attempts is not applied, and records nothing.
        endings = complete_attempts(db, [(t, 1, {}) for t in claimed], worker_id="zombie", hostname="h")
        assert not any(e.applied for e in endings)
        assert _last_ids(db) == {}
        endings = complete_attempts(db, [(t, 1) for t in claimed], worker_id="w1", hostname="h")
        assert all(e.applied for e in endings)
        assert sorted(_last_ids(db)) == [A.name, B.name]
    finally:
        runner.close()


def test_outlet_annotations_are_checked() -> None:
    context = TaskContext(
        run_id="r", dag_id="d", task_id="t", logical_date=datetime(2026, 1, 1), attempt=1, outlets=(A.name,)
    )
    with pytest.raises(ValueError, match=r"declared outlets: warehouse\.a"):
        context.outlet_event("warehouse.other")
    with pytest.raises(ValueError, match="version"):
        context.outlet_event(A, version="x" * 251)
    context.outlet_event(A.name, version="1", metadata={"rows": 1})
    context.outlet_event(A, metadata={"rows": 2})
    assert context.outlet_events == {A.name: {"version": None, "metadata": {"rows": 2}}}


def test_oversized_outlet_metadata_fails_the_attempt_without_retry(tmp_path: Any) -> None:
    @task(outlets=[A], retries=3, retry_delay=0)
    def big(context: TaskContext) -> int:
        context.outlet_event(A, metadata={"blob": "x" * 20_000})
        return 1

    @dag(dag_id="big")
    def big_dag() -> None:
        big()

    runner = DagRunner(big_dag)
    try:
        result = runner.run_until_done(runner.trigger())
        assert result.state == "failed"
        [attempt] = result.attempts("big")
        assert attempt.error_type == "OutletMetadataTooLarge"
        assert "16384" in (attempt.error_message or "")
        assert result.dataset_events == []
    finally:
        runner.close()


# -- triggering -----------------------------------------------------------------------------------


def test_consumer_runs_once_every_dataset_has_a_new_event(db: Database) -> None:
    _register(db, _consumer())
    lead = _leader(db)
    assert _trigger(db, lead) == 0  # first sight: marks start at the current events
    assert _marks(db) == {A.name: 0, B.name: 0}

    _emit(db, A.name)
    assert _trigger(db, lead) == 0
    assert _dataset_runs(db) == []
    _emit(db, B.name)
    assert _trigger(db, lead) == 1
    [run] = _dataset_runs(db)
    assert run.run_type == "dataset" and run.leader_epoch == lead.epoch
    assert run.manifest is not None
    consumed = run.manifest["consumed_dataset_events"]
    assert [e["dataset"] for e in consumed] == [A.name, B.name]
    assert run.manifest["consumed_dataset_events_total"] == 2
    assert _marks(db) == {A.name: consumed[0]["id"], B.name: consumed[1]["id"]}
    assert _trigger(db, lead) == 0


def test_a_burst_of_events_becomes_one_run(db: Database) -> None:
    _register(db, _consumer())
    lead = _leader(db)
    _trigger(db, lead)
    _emit(db, A.name, 20)
    _emit(db, B.name, 5)

    assert _trigger(db, lead) == 1
    [run] = _dataset_runs(db)
    assert run.manifest is not None
    consumed = run.manifest["consumed_dataset_events"]
    assert len(consumed) == 25 and run.manifest["consumed_dataset_events_total"] == 25
    assert sorted(e["id"] for e in consumed) == [e["id"] for e in consumed]
    assert {e["dataset"] for e in consumed} == {A.name, B.name}
    assert set(consumed[0]) == {"id", "dataset", "run_id", "dag_id", "task_id", "version", "created_at"}
    ranges = run.manifest["consumed_dataset_ranges"]
    assert (ranges[A.name]["count"], ranges[B.name]["count"]) == (20, 5)
    times = sorted(datetime.fromisoformat(e["created_at"]) for e in consumed)
    assert (run.data_interval_start, run.data_interval_end) == (times[0], times[-1])
    assert _marks(db) == _last_ids(db)
    assert _trigger(db, lead) == 0
    assert len(_dataset_runs(db)) == 1


def test_events_before_registration_do_not_trigger(db: Database) -> None:
    _emit(db, A.name, 3)
    _emit(db, B.name)
    _register(db, _consumer())
    lead = _leader(db)
    assert _trigger(db, lead) == 0
    assert _marks(db) == _last_ids(db)
    _emit(db, A.name)
    _emit(db, B.name)
    assert _trigger(db, lead) == 1
    [run] = _dataset_runs(db)
    assert run.manifest is not None and run.manifest["consumed_dataset_events_total"] == 2


def test_paused_consumer_creates_nothing_until_unpaused(db: Database) -> None:
    _register(db, _consumer())
    lead = _leader(db)
    _trigger(db, lead)
    set_paused(db, "consumer", paused=True, actor="test")
    _emit(db, A.name)
    _emit(db, B.name)
    assert _trigger(db, lead) == 0
    assert _marks(db) == {A.name: 0, B.name: 0}
    set_paused(db, "consumer", paused=False, actor="test")
    assert _trigger(db, lead) == 1


def test_max_active_runs_holds_events_for_a_later_run(db: Database) -> None:
    _register(db, _consumer(max_active_runs=1))
    lead = _leader(db)
    _trigger(db, lead)
    _emit(db, A.name)
    _emit(db, B.name)
    assert _trigger(db, lead) == 1
    _emit(db, A.name, 3)
    _emit(db, B.name, 2)
    assert _trigger(db, lead) == 0  # the first run is still active
    [first] = _dataset_runs(db)

    def finish(conn: Connection) -> None:
        assert run_store.set_run_state(
            conn,
            first.run_id,
            by=UseCase.CLOSE,
            expected=RunState.RUNNING,
            new=RunState.SUCCESS,
            now=db_now(conn),
        )

    db.transact(finish)
    assert _trigger(db, lead) == 1
    second = _dataset_runs(db)[-1]
    assert second.manifest is not None and second.manifest["consumed_dataset_events_total"] == 5


def test_stale_epoch_creates_nothing(db: Database) -> None:
    _register(db, _consumer())
    lead = _leader(db)
    assert lead.epoch is not None
    with pytest.raises(NotLeader):
        trigger_dataset_runs(db, holder=lead.holder, epoch=lead.epoch + 1, default_queue_timeout_s=60)
    with pytest.raises(NotLeader):
        trigger_dataset_runs(db, holder="someone-else", epoch=lead.epoch, default_queue_timeout_s=60)
    assert _marks(db) == {}
    _trigger(db, lead)
    _emit(db, A.name)
    _emit(db, B.name)
    with pytest.raises(NotLeader):
        trigger_dataset_runs(db, holder=lead.holder, epoch=lead.epoch + 1, default_queue_timeout_s=60)
    assert _dataset_runs(db) == []
    assert _marks(db) == {A.name: 0, B.name: 0}


def test_manifest_lists_at_most_the_cap_and_each_datasets_newest(db: Database) -> None:
    _register(db, _consumer())
    lead = _leader(db)
    _trigger(db, lead)
    _emit(db, B.name)

    def burst(conn: Connection) -> None:
        now = db_now(conn)
        rows = [
            {"dataset": A.name, "run_id": None, "dag_id": None, "task_id": None, "version": None}
            | {"extra": {}, "created_at": now}
            for _ in range(MAX_LISTED_EVENTS + 10)
        ]
        record_outlet_events(conn, rows)

    db.transact(burst)
    assert _trigger(db, lead) == 1
    [run] = _dataset_runs(db)
    assert run.manifest is not None
    consumed = run.manifest["consumed_dataset_events"]
    assert len(consumed) == MAX_LISTED_EVENTS
    assert run.manifest["consumed_dataset_events_total"] == MAX_LISTED_EVENTS + 11
    assert B.name in {e["dataset"] for e in consumed}
    assert max(e["id"] for e in consumed) == _last_ids(db)[A.name]


def test_dataset_events_reads_check_their_input(db: Database) -> None:
    with pytest.raises(InvalidRequest, match="no dataset"):
        dataset_events(db, "never.seen")
    with pytest.raises(InvalidRequest, match="limit"):
        dataset_events(db, A.name, limit=0)
    with pytest.raises(InvalidRequest, match="dataset name"):
        dataset_events(db, "has space")
    _register(db, _consumer())
    assert dataset_events(db, A.name) == []  # declared by a consumer: known, no events yet
