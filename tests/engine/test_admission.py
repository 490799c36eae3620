"""Admission control: work that would overfill a queue or a DAG is refused, nothing half-created."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Connection

from treadle import dag, task
from treadle.domain.admission import PER_DAG_SETTING, PER_QUEUE_SETTING, AdmissionLimits
from treadle.engine import accounts, queries
from treadle.engine import backfill_actions as bf
from treadle.engine.admission import REFUSED_ACTION, admission_refusal_counts
from treadle.engine.dags import sync_dags
from treadle.engine.datasets import record_outlet_events, trigger_dataset_runs
from treadle.engine.leadership import Leadership
from treadle.engine.runs import trigger_run
from treadle.errors import Overloaded
from treadle.store.database import Database, db_now

START = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=2)


@task
def left() -> int:
    return 1


@task(queue="gpu")
def right() -> int:
    return 2


@task
def after(a: int, b: int) -> int:
    return a + b


@dag(dag_id="wide", schedule=timedelta(hours=1), start_date=START, max_active_runs=4)
def wide() -> None:
    # Two roots (one on `default`, one on `gpu`) and one pending task.
    after(left(), right())


@task
def single() -> int:
    return 0


@dag(dag_id="other")
def other() -> None:
    single()


@dag(dag_id="on_dataset", schedule=["lake.orders"])
def on_dataset() -> None:
    single()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    """SQLite and PostgreSQL, with the three DAGs registered."""
    url: str = request.getfixturevalue({"sqlite": "sqlite_url", "postgresql": "pg_url"}[request.param])
    database = Database(url)
    sync_dags(
        database, structures=[d.structure() for d in (wide, other, on_dataset)], scanned_files=[], errors={}
    )
    yield database
    database.dispose()


def _refusals(db: Database) -> list[Any]:
    return accounts.list_audit(db, action=REFUSED_ACTION, limit=100)


def _runs(db: Database, dag_id: str) -> list[Any]:
    return queries.list_runs(db, dag_id=dag_id, limit=1000)


def test_a_trigger_past_the_queue_limit_is_refused_with_nothing_created(db: Database) -> None:
    limits = AdmissionLimits(per_queue=3)
    before = admission_refusal_counts().get(("trigger", PER_QUEUE_SETTING), 0)
    for _ in range(2):  # each run queues one instance on `default` and one on `gpu`
        trigger_run(db, "wide", triggered_by="cli:alice", admission=limits)
    trigger_run(db, "other", triggered_by="cli:alice", admission=limits)  # default: 3 queued now
    with pytest.raises(Overloaded) as refused:
        trigger_run(db, "wide", triggered_by="cli:alice", admission=limits, address="10.0.0.7")
    exc = refused.value
    assert (exc.setting, exc.limit, exc.scope, exc.name, exc.queued, exc.adding) == (
        PER_QUEUE_SETTING,
        3,
        "queue",
        "default",
        3,
        1,
    )
    assert PER_QUEUE_SETTING in str(exc) and exc.retry_after_s > 0
    assert len(_runs(db, "wide")) == 2
    assert len(accounts.list_audit(db, action="run.trigger", limit=100)) == 3
    [entry] = _refusals(db)
    assert (entry.actor, entry.target, entry.address) == ("cli:alice", "dag:wide", "10.0.0.7")
    assert entry.details["kind"] == "trigger" and entry.details["setting"] == PER_QUEUE_SETTING
    assert admission_refusal_counts()[("trigger", PER_QUEUE_SETTING)] == before + 1
    # A higher limit admits the same kind of work.
    trigger_run(db, "other", triggered_by="t", admission=AdmissionLimits(per_queue=4))


def test_the_dag_limit_counts_only_that_dags_queued_instances(db: Database) -> None:
    limits = AdmissionLimits(per_dag=4)
    trigger_run(db, "wide", triggered_by="t", admission=limits)
    trigger_run(db, "wide", triggered_by="t", admission=limits)  # 4 queued in `wide`
    for _ in range(4):
        trigger_run(db, "other", triggered_by="t", admission=limits)
    with pytest.raises(Overloaded) as refused:
        trigger_run(db, "wide", triggered_by="t", admission=limits)
    assert (refused.value.setting, refused.value.name, refused.value.queued) == (PER_DAG_SETTING, "wide", 4)
    assert len(_runs(db, "wide")) == 2 and len(_runs(db, "other")) == 4
    # No limit set: the same trigger is admitted.
    trigger_run(db, "wide", triggered_by="t")
    assert len(_runs(db, "wide")) == 3


def test_a_backfill_whose_first_wave_would_overfill_is_refused_and_not_recorded(db: Database) -> None:
    request: dict[str, Any] = {
        "from_date": START + timedelta(hours=1),
        "to_date": START + timedelta(hours=10),
        "reason": "reload",
        "requested_by": "cli:bob",
        "max_span_days": 366,
    }
    trigger_run(db, "other", triggered_by="t")  # one queued on `default`
    with pytest.raises(Overloaded) as refused:
        # 3 runs at once queue 3 on `default`: 1 + 3 > 3.
        bf.create_backfill(db, "wide", max_active=3, admission=AdmissionLimits(per_queue=3), **request)
    assert "backfill" in str(refused.value) and refused.value.adding == 3
    assert bf.list_backfills(db) == []
    assert [e.details["kind"] for e in _refusals(db)] == ["backfill"]
    assert accounts.list_audit(db, action="backfill.create", limit=10) == []
    made = bf.create_backfill(db, "wide", max_active=2, admission=AdmissionLimits(per_queue=3), **request)
    assert [b.backfill.id for b in bf.list_backfills(db)] == [made.id]


def _emit(db: Database) -> None:
    def work(conn: Connection) -> None:
        row: dict[str, Any] = {
            "dataset": "lake.orders",
            "run_id": "manual__x",
            "dag_id": "producer",
            "task_id": "emit",
            "version": None,
            "extra": {},
            "created_at": db_now(conn),
        }
        record_outlet_events(conn, [row])

    db.transact(work)


def test_a_dataset_run_past_a_limit_waits_with_its_events_and_is_audited_once(db: Database) -> None:
    lead = Leadership(db, holder="t", lease_s=30)
    assert lead.refresh() and lead.epoch is not None
    limits = AdmissionLimits(per_queue=1)

    def dataset_pass() -> int:
        assert lead.epoch is not None
        return trigger_dataset_runs(
            db, holder=lead.holder, epoch=lead.epoch, default_queue_timeout_s=60, admission=limits
        )

    assert dataset_pass() == 0  # first sight: marks set, no run
    _emit(db)
    trigger_run(db, "other", triggered_by="t")  # fills `default`
    before = admission_refusal_counts().get(("dataset_run", PER_QUEUE_SETTING), 0)
    assert dataset_pass() == 0
    assert dataset_pass() == 0
    assert _runs(db, "on_dataset") == []
    [entry] = _refusals(db)  # two refusals, one audit entry
    assert (entry.actor, entry.details["kind"]) == ("scheduler", "dataset_run")
    assert admission_refusal_counts()[("dataset_run", PER_QUEUE_SETTING)] == before + 2
    limits = AdmissionLimits(per_queue=2)
    assert dataset_pass() == 1  # the held-back events are consumed by the admitted run
    assert len(_runs(db, "on_dataset")) == 1


def test_the_backfill_drain_starts_only_the_runs_the_limits_admit(db: Database) -> None:
    from treadle.engine.backfill_drain import drain_backfills

    made = bf.create_backfill(
        db,
        "wide",
        from_date=START + timedelta(hours=1),
        to_date=START + timedelta(hours=6),
        reason="reload",
        requested_by="cli:bob",
        max_active=4,
        max_span_days=366,
    )
    lead = Leadership(db, holder="t", lease_s=30)
    assert lead.refresh() and lead.epoch is not None
    before = admission_refusal_counts().get(("backfill_drain", PER_DAG_SETTING), 0)

    def drain(limits: AdmissionLimits) -> int:
        assert lead.epoch is not None
        return drain_backfills(
            db, holder=lead.holder, epoch=lead.epoch, default_queue_timeout_s=60, admission=limits
        )

    # Each run queues 2 instances of `wide`: a DAG limit of 5 admits two runs, not four.
    assert drain(AdmissionLimits(per_dag=5)) == 2
    assert len(_runs(db, "wide")) == 2
    assert admission_refusal_counts()[("backfill_drain", PER_DAG_SETTING)] == before + 1
    assert drain(AdmissionLimits(per_dag=5)) == 0  # still full: held back again, nothing skipped
    progress = bf.get_backfill(db, made.id).status
    assert (progress.backfill.handled, progress.backfill.state) == (2, "running")
    assert drain(AdmissionLimits()) == 2  # without limits the backfill goes on to max_active
    assert len(_runs(db, "wide")) == 4
