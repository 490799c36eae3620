"""Datasets, their append-only events, and each dataset-scheduled DAG's consumption marks.

Events of one dataset commit in id order: a writer locks the dataset's row before it inserts
the events (`record_events`), so a reader that sees `datasets.last_event_id = N` knows every
event of that dataset with an id up to N is committed. Dataset triggers rely on it: they
consume exactly the range (mark, last_event_id] and move the mark to its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagStructure
from treadle.store import dialects
from treadle.store.tables import dag_versions, dags, dataset_consumers, dataset_events, datasets, schedules


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetEventInfo:
    """One recorded dataset event."""

    id: int
    dataset: str
    run_id: str | None
    dag_id: str | None
    task_id: str | None
    version: str | None
    extra: dict[str, Any]  # Any: user JSON
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetRow:
    """A dataset row with how many events it has."""

    name: str
    created_at: datetime
    last_event_id: int | None
    last_event_at: datetime | None
    events: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RangeSummary:
    """Events of one dataset in an id range: how many, and the first and last creation time."""

    count: int
    first_at: datetime
    last_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerSchedule:
    """A DAG's dataset schedule spec and pause flag."""

    dag_id: str
    spec: dict[str, Any]  # Any: JSON
    is_paused: bool


def _event(row: sa.Row[Any]) -> DatasetEventInfo:
    m = row._mapping
    return DatasetEventInfo(
        id=int(m["id"]),
        dataset=m["dataset"],
        run_id=m["run_id"],
        dag_id=m["dag_id"],
        task_id=m["task_id"],
        version=m["version"],
        extra=m["extra"] or {},
        created_at=m["created_at"],
    )


def _lock(conn: Connection, names: Sequence[str]) -> set[str]:
    """Lock the rows of `names` (in name order) and return the names that have one."""
    stmt = sa.select(datasets.c.name).where(datasets.c.name.in_(names)).order_by(datasets.c.name)
    return set(conn.execute(dialects.lock_row(stmt, conn)).scalars())


def record_events(conn: Connection, events: Sequence[Mapping[str, Any]], *, at: datetime) -> None:
    """Append events (dataset_events columns but id) and move each dataset's last event.

    The dataset rows are created on first sight and locked before the events are inserted, so
    one dataset's events commit in id order (see the module docstring).
    """
    if not events:
        return
    names = sorted({e["dataset"] for e in events})
    missing = sorted(set(names) - _lock(conn, names))
    if missing:
        conn.execute(dialects.insert_ignore(conn, datasets), [{"name": n, "created_at": at} for n in missing])
        _lock(conn, missing)
    conn.execute(sa.insert(dataset_events), [dict(e) for e in events])
    # A failed-quality version is recorded but never becomes the dataset's newest event: nothing
    # is triggered by it (a batch holds either only such events or none: see quality gates).
    names = sorted({e["dataset"] for e in events if (e.get("extra") or {}).get("quality") != "failed"})
    if not names:
        return
    newest = (
        sa.select(sa.func.max(dataset_events.c.id))
        .where(dataset_events.c.dataset == datasets.c.name)
        .scalar_subquery()
    )
    conn.execute(
        sa.update(datasets).where(datasets.c.name.in_(names)).values(last_event_id=newest, last_event_at=at)
    )


def last_event_ids(conn: Connection, names: Iterable[str]) -> dict[str, int]:
    """The newest event id of each named dataset that has events."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    stmt = sa.select(datasets.c.name, datasets.c.last_event_id).where(
        datasets.c.name.in_(wanted), datasets.c.last_event_id.is_not(None)
    )
    return {r.name: int(r.last_event_id) for r in conn.execute(stmt)}


def consumer_marks(conn: Connection, dag_ids: Iterable[str]) -> dict[str, dict[str, int]]:
    """dag id -> dataset -> id of the newest event its runs consumed (DAGs without rows are absent)."""
    wanted = sorted(set(dag_ids))
    if not wanted:
        return {}
    marks: dict[str, dict[str, int]] = {}
    stmt = sa.select(
        dataset_consumers.c.dag_id, dataset_consumers.c.dataset, dataset_consumers.c.last_event_id
    ).where(dataset_consumers.c.dag_id.in_(wanted))
    for r in conn.execute(stmt):
        marks.setdefault(r.dag_id, {})[r.dataset] = int(r.last_event_id)
    return marks


def set_marks(conn: Connection, moves: Sequence[tuple[str, str, int | None, int]]) -> int:
    """Move consumption marks: (dag id, dataset, expected mark or None if no row, new mark).

    Existing rows move by compare-and-set on the expected mark; missing rows are inserted (a
    concurrent insert raises a unique violation). Returns how many applied.
    """
    applied = 0
    inserts = [{"dag_id": d, "dataset": n, "last_event_id": new} for d, n, old, new in moves if old is None]
    for dag_id, name, old, new in moves:
        if old is None:
            continue
        applied += conn.execute(
            sa.update(dataset_consumers)
            .where(
                dataset_consumers.c.dag_id == dag_id,
                dataset_consumers.c.dataset == name,
                dataset_consumers.c.last_event_id == old,
            )
            .values(last_event_id=new)
        ).rowcount
    if inserts:
        conn.execute(sa.insert(dataset_consumers), inserts)
        applied += len(inserts)
    return applied


def range_summaries(conn: Connection, ranges: Mapping[str, tuple[int, int]]) -> dict[str, RangeSummary]:
    """Per dataset: count and first/last creation time of its events with after < id <= through."""
    if not ranges:
        return {}
    c = dataset_events.c
    stmt = (
        sa.select(c.dataset, sa.func.count(), sa.func.min(c.created_at), sa.func.max(c.created_at))
        .where(
            sa.or_(
                *(
                    sa.and_(c.dataset == name, c.id > after, c.id <= through)
                    for name, (after, through) in sorted(ranges.items())
                )
            )
        )
        .group_by(c.dataset)
    )
    return {r[0]: RangeSummary(count=int(r[1]), first_at=r[2], last_at=r[3]) for r in conn.execute(stmt)}


def newest_in_range(
    conn: Connection, dataset: str, *, after_id: int, through_id: int, limit: int
) -> list[DatasetEventInfo]:
    """Up to `limit` newest events of `dataset` with after_id < id <= through_id, newest first.

    `extra` is not read (left empty): these feed run manifests, which do not carry metadata.
    """
    columns = [c for c in dataset_events.c if c.name != "extra"]
    stmt: sa.Select[Any] = (
        sa.select(*columns, sa.null().label("extra"))
        .where(
            dataset_events.c.dataset == dataset,
            dataset_events.c.id > after_id,
            dataset_events.c.id <= through_id,
        )
        .order_by(dataset_events.c.id.desc())
        .limit(limit)
    )
    return [_event(r) for r in conn.execute(stmt)]


def list_datasets(conn: Connection) -> list[DatasetRow]:
    """Every dataset that has a row (it had an event), with its event count, by name."""
    counts = (
        sa.select(dataset_events.c.dataset, sa.func.count().label("events"))
        .group_by(dataset_events.c.dataset)
        .subquery()
    )
    stmt = (
        sa.select(datasets, counts.c.events)
        .select_from(datasets.outerjoin(counts, counts.c.dataset == datasets.c.name))
        .order_by(datasets.c.name)
    )
    return [
        DatasetRow(
            name=r.name,
            created_at=r.created_at,
            last_event_id=None if r.last_event_id is None else int(r.last_event_id),
            last_event_at=r.last_event_at,
            events=int(r.events or 0),
        )
        for r in conn.execute(stmt)
    ]


def exists(conn: Connection, name: str) -> bool:
    """True if the dataset has a row."""
    return conn.execute(sa.select(datasets.c.name).where(datasets.c.name == name)).first() is not None


def events(conn: Connection, name: str, *, limit: int) -> list[DatasetEventInfo]:
    """The newest `limit` events of one dataset, newest first."""
    stmt = (
        sa.select(dataset_events)
        .where(dataset_events.c.dataset == name)
        .order_by(dataset_events.c.id.desc())
        .limit(limit)
    )
    return [_event(r) for r in conn.execute(stmt)]


def events_of_run(conn: Connection, run_id: str) -> list[DatasetEventInfo]:
    """Events the tasks of one run recorded, oldest first."""
    stmt = sa.select(dataset_events).where(dataset_events.c.run_id == run_id).order_by(dataset_events.c.id)
    return [_event(r) for r in conn.execute(stmt)]


def consumer_schedules(conn: Connection) -> list[ConsumerSchedule]:
    """Dataset schedules of every DAG, paused or not, by DAG id."""
    stmt = (
        sa.select(schedules.c.dag_id, schedules.c.spec, dags.c.is_paused)
        .select_from(schedules.join(dags, dags.c.dag_id == schedules.c.dag_id))
        .where(schedules.c.kind == "dataset")
        .order_by(schedules.c.dag_id)
    )
    return [
        ConsumerSchedule(dag_id=r.dag_id, spec=r.spec, is_paused=bool(r.is_paused))
        for r in conn.execute(stmt)
    ]


def latest_structures(conn: Connection) -> list[DagStructure]:
    """The latest registered structure of every active DAG, by DAG id."""
    stmt = (
        sa.select(dag_versions.c.structure)
        .select_from(dags.join(dag_versions, dag_versions.c.id == dags.c.latest_version_id))
        .where(dags.c.is_active == sa.true())
        .order_by(dags.c.dag_id)
    )
    return [DagStructure.from_json(data) for data in conn.execute(stmt).scalars()]
