"""One DAG as an operator looks it up: structure, contract, schedule, outputs' freshness, latest runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagStructure, DagVersion
from treadle.domain.records import DagInfo, RunInfo
from treadle.engine.queries import runs_for_operators
from treadle.engine.versions import version_of
from treadle.errors import DagNotFound
from treadle.store import dags as dag_store
from treadle.store import datasets as dataset_store
from treadle.store import runs as run_store
from treadle.store import schedules as schedule_store
from treadle.store.database import Database, db_now


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputFreshness:
    """One output dataset of a DAG: its newest event and whether that is within the DAG's SLO."""

    name: str
    last_event_at: datetime | None
    #: Seconds since the newest event (None: none yet).
    age_s: float | None
    #: None when the DAG has no freshness SLO; False also when the dataset never had an event.
    within_slo: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DagDetail:
    """A registered DAG with its latest version and what happened to it lately."""

    dag: DagInfo
    version: DagVersion
    #: The schedule's watermark: last fire time and the next one it waits for (None: none).
    last_fire_at: datetime | None
    next_fire_at: datetime | None
    outputs: list[OutputFreshness]
    #: Newest first, secret params masked.
    runs: list[RunInfo]
    #: The database's time when this was read.
    now: datetime


def dag_detail(db: Database, dag_id: str, *, runs: int = 10) -> DagDetail:
    """Everything `treadle dags show` prints about one DAG. Raises DagNotFound."""

    def work(conn: Connection) -> DagDetail:
        dag = dag_store.get_dag(conn, dag_id)
        if dag is None or dag.latest_version_id is None:
            raise DagNotFound(f"no DAG {dag_id!r} is registered (run `treadle dags sync`?)")
        version = version_of(db, conn, dag.latest_version_id)
        now = db_now(conn)
        schedule = schedule_store.get(conn, dag_id)
        names = version.structure.outputs()
        newest = dataset_store.last_event_times(conn, names)
        contract = version.structure.contract
        return DagDetail(
            dag=dag,
            version=version,
            last_fire_at=schedule.last_fire_at if schedule else None,
            next_fire_at=schedule.next_fire_at if schedule else None,
            outputs=[
                _freshness(name, newest.get(name), slo_s=contract.slos_of(name)[0], now=now) for name in names
            ],
            runs=runs_for_operators(db, conn, run_store.list_runs(conn, dag_id=dag_id, limit=runs)),
            now=now,
        )

    return db.query(work)


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetFreshness:
    """One output of a DAG with a freshness SLO: its age against the maximum age, and whether
    the latest "published by" deadline saw a new version."""

    dataset: str
    dag_id: str
    owner: str
    #: The maximum age (None: the DAG sets only a deadline).
    slo_s: float | None
    last_event_at: datetime | None
    #: Seconds since the newest event (None: none yet).
    age_s: float | None
    #: Within every SLO the DAG sets; False also when the dataset never had an event.
    within_slo: bool
    #: "HH:MM <zone>" (None: no deadline).
    published_by: str | None = None
    #: The latest deadline that has passed, and the next one.
    deadline_at: datetime | None = None
    next_deadline_at: datetime | None = None
    #: Whether a new version came between the deadline before `deadline_at` and it (None: no
    #: deadline, or never published).
    met_deadline: bool | None = None


def dataset_freshness(db: Database) -> tuple[datetime, list[DatasetFreshness]]:
    """Every output of every DAG (latest version) with a freshness SLO, by dataset then DAG, with
    the database's time it was measured at (`treadle datasets freshness`)."""

    def work(conn: Connection) -> tuple[datetime, list[DatasetFreshness]]:
        now = db_now(conn)
        wanted = [
            (structure, name)
            for structure in dataset_store.latest_structures(conn)
            if structure.contract.has_freshness_slo
            for name in structure.outputs()
            if structure.contract.slos_of(name) != (None, None)
        ]
        newest = dataset_store.last_event_times(conn, sorted({name for _, name in wanted}))
        found = [_dataset_freshness(structure, name, newest.get(name), now=now) for structure, name in wanted]
        return now, sorted(found, key=lambda f: (f.dataset, f.dag_id))

    return db.query(work)


def _dataset_freshness(
    structure: DagStructure, name: str, last: datetime | None, *, now: datetime
) -> DatasetFreshness:
    contract = structure.contract
    slo_s, deadline = contract.slos_of(name)
    f = _freshness(name, last, slo_s=slo_s, now=now)
    due = next_due = met = None
    if deadline is not None:
        due, next_due = deadline.latest_at_or_before(now), deadline.next_after(now)
        met = None if last is None else last >= deadline.previous(due)
    within = last is not None and f.within_slo is not False and met is not False
    return DatasetFreshness(
        dataset=name,
        dag_id=structure.dag_id,
        owner=structure.owner,
        slo_s=slo_s,
        last_event_at=f.last_event_at,
        age_s=f.age_s,
        within_slo=within,
        published_by=None if deadline is None else str(deadline),
        deadline_at=due,
        next_deadline_at=next_due,
        met_deadline=met,
    )


def _freshness(name: str, last: datetime | None, *, slo_s: float | None, now: datetime) -> OutputFreshness:
    age = None if last is None else max((now - last).total_seconds(), 0.0)
    within = None if slo_s is None else age is not None and age <= slo_s
    return OutputFreshness(name=name, last_event_at=last, age_s=age, within_slo=within)
