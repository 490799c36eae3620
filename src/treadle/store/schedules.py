"""Schedules: each scheduled DAG's spec and durable watermark (the last and next nominal fire)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import RunState, RunType
from treadle.store import dialects
from treadle.store.tables import dag_runs, dags, schedules

#: Run states that count against max_active_runs.
ACTIVE_RUN_STATES = (RunState.QUEUED.value, RunState.RUNNING.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """One schedule row, with the DAG's pause flag and latest version."""

    dag_id: str
    kind: str
    spec: dict[str, Any]  # Any: JSON
    last_fire_at: datetime | None
    next_fire_at: datetime | None
    is_paused: bool
    latest_version_id: int | None


def _select() -> sa.Select[Any]:
    return sa.select(
        schedules.c.dag_id,
        schedules.c.kind,
        schedules.c.spec,
        schedules.c.last_fire_at,
        schedules.c.next_fire_at,
        dags.c.is_paused,
        dags.c.latest_version_id,
    ).select_from(schedules.join(dags, dags.c.dag_id == schedules.c.dag_id))


def _row(r: sa.Row[Any]) -> ScheduleRow:
    m = r._mapping
    return ScheduleRow(
        dag_id=m["dag_id"],
        kind=m["kind"],
        spec=m["spec"],
        last_fire_at=m["last_fire_at"],
        next_fire_at=m["next_fire_at"],
        is_paused=bool(m["is_paused"]),
        latest_version_id=m["latest_version_id"],
    )


def get(conn: Connection, dag_id: str) -> ScheduleRow | None:
    """Return the schedule of one DAG, or None."""
    row = conn.execute(_select().where(schedules.c.dag_id == dag_id)).first()
    return _row(row) if row else None


def put(
    conn: Connection,
    dag_id: str,
    *,
    kind: str,
    spec: dict[str, Any],
    last_fire_at: datetime | None,
    next_fire_at: datetime | None,
    now: datetime,
) -> None:
    """Insert or replace a DAG's schedule (the caller read the row it replaces in this transaction)."""
    values = {
        "kind": kind,
        "spec": spec,
        "last_fire_at": last_fire_at,
        "next_fire_at": next_fire_at,
        "updated_at": now,
    }
    updated = conn.execute(sa.update(schedules).where(schedules.c.dag_id == dag_id).values(**values)).rowcount
    if not updated:
        conn.execute(sa.insert(schedules).values(dag_id=dag_id, **values))


def get_many(conn: Connection, dag_ids: Sequence[str], *, batch: int = 500) -> dict[str, ScheduleRow]:
    """The schedules of those DAGs that have one, by DAG id (one read per `batch` ids)."""
    found: dict[str, ScheduleRow] = {}
    for start in range(0, len(dag_ids), batch):
        chunk = dag_ids[start : start + batch]
        found.update(
            {r.dag_id: _row(r) for r in conn.execute(_select().where(schedules.c.dag_id.in_(chunk)))}
        )
    return found


def put_many(conn: Connection, rows: Sequence[dict[str, Any]], *, existing: set[str], now: datetime) -> None:
    """Write many schedules (`put`'s fields with `dag_id`): one executemany for the rows of
    DAGs in `existing` (which have a row, read in this transaction), one for the others."""
    stamped = [{**r, "updated_at": now} for r in rows]
    inserts = [r for r in stamped if r["dag_id"] not in existing]
    updates = [{**r, "key": r["dag_id"]} for r in stamped if r["dag_id"] in existing]
    if inserts:
        conn.execute(sa.insert(schedules), inserts)
    if updates:
        columns = ("kind", "spec", "last_fire_at", "next_fire_at", "updated_at")
        stmt = sa.update(schedules).where(schedules.c.dag_id == sa.bindparam("key"))
        conn.execute(stmt.values({c: sa.bindparam(c) for c in columns}), updates)


@dataclass(frozen=True, slots=True, kw_only=True)
class DueRow:
    """A due schedule: its watermark and the DAG version whose spec it follows."""

    dag_id: str
    last_fire_at: datetime | None
    next_fire_at: datetime
    latest_version_id: int


def due(conn: Connection, *, now: datetime, limit: int) -> list[DueRow]:
    """Timed schedules of unpaused, active DAGs whose next fire time has come, earliest first.

    The spec is not read: it is the schedule of the DAG's latest version (registered with it),
    which the caller has parsed and cached already.
    """
    stmt = (
        sa.select(
            schedules.c.dag_id, schedules.c.last_fire_at, schedules.c.next_fire_at, dags.c.latest_version_id
        )
        .select_from(schedules.join(dags, dags.c.dag_id == schedules.c.dag_id))
        .where(
            schedules.c.next_fire_at <= now,
            schedules.c.kind.in_(["cron", "interval"]),
            dags.c.is_paused == sa.false(),
            dags.c.is_active == sa.true(),
            dags.c.latest_version_id.is_not(None),
        )
        .order_by(schedules.c.next_fire_at)
        .limit(limit)
    )
    # Firing passes of the leader may run side by side: each takes schedules no other holds.
    return [DueRow(**r._mapping) for r in conn.execute(dialects.lock_for_claim(stmt, conn, of=schedules))]


def next_wakeup(conn: Connection, *, after: datetime) -> datetime | None:
    """The earliest next fire time later than `after` of an unpaused, active DAG (when to wake up)."""
    stmt = (
        sa.select(sa.func.min(schedules.c.next_fire_at))
        .select_from(schedules.join(dags, dags.c.dag_id == schedules.c.dag_id))
        .where(
            schedules.c.next_fire_at > after, dags.c.is_paused == sa.false(), dags.c.is_active == sa.true()
        )
    )
    value: datetime | None = conn.execute(stmt).scalar()
    return value


def advance(
    conn: Connection,
    moves: Sequence[tuple[str, datetime | None, datetime | None, datetime | None]],
    *,
    now: datetime,
) -> int:
    """Move watermarks: (dag_id, expected next_fire_at, new last_fire_at, new next_fire_at).

    Each move is a compare-and-set on the next fire time the caller read; returns how many
    applied (the caller rolls back when fewer than asked did).
    """
    if not moves:
        return 0
    stmt = (
        sa.update(schedules)
        .where(
            schedules.c.dag_id == sa.bindparam("k_dag_id"),
            schedules.c.next_fire_at == sa.bindparam("k_expected"),
        )
        .values(last_fire_at=sa.bindparam("v_last"), next_fire_at=sa.bindparam("v_next"), updated_at=now)
    )
    params = [{"k_dag_id": d, "k_expected": e, "v_last": last, "v_next": nxt} for d, e, last, nxt in moves]
    # One executemany (pipelined by psycopg); every dialect here reports its summed rowcount.
    return int(conn.execute(stmt, params).rowcount)


def active_run_counts(conn: Connection, dag_ids: Sequence[str], *, run_type: RunType) -> dict[str, int]:
    """Queued or running runs of the given type per DAG."""
    if not dag_ids:
        return {}
    stmt = (
        sa.select(dag_runs.c.dag_id, sa.func.count())
        .where(
            dag_runs.c.dag_id.in_(sorted(set(dag_ids))),
            dag_runs.c.state.in_(ACTIVE_RUN_STATES),
            dag_runs.c.run_type == run_type.value,
        )
        .group_by(dag_runs.c.dag_id)
    )
    return {r[0]: int(r[1]) for r in conn.execute(stmt)}


def existing_logical_dates(
    conn: Connection, wanted: Sequence[tuple[str, datetime]], *, run_types: Sequence[RunType]
) -> set[tuple[str, datetime]]:
    """Which (dag_id, logical_date) pairs already have a run of one of `run_types`."""
    if not wanted:
        return set()
    dag_ids = sorted({d for d, _ in wanted})
    dates = sorted({t for _, t in wanted})
    stmt = sa.select(dag_runs.c.dag_id, dag_runs.c.logical_date).where(
        dag_runs.c.dag_id.in_(dag_ids),
        dag_runs.c.logical_date.in_(dates),
        dag_runs.c.run_type.in_([t.value for t in run_types]),
    )
    found = {(r.dag_id, r.logical_date) for r in conn.execute(stmt)}
    return found & set(wanted)


def dataset_schedules(conn: Connection) -> list[ScheduleRow]:
    """Dataset-triggered schedules of unpaused, active DAGs."""
    stmt = _select().where(
        schedules.c.kind == "dataset", dags.c.is_paused == sa.false(), dags.c.is_active == sa.true()
    )
    return [_row(r) for r in conn.execute(stmt)]


def all_rows(conn: Connection) -> dict[str, ScheduleRow]:
    """Every schedule row, by DAG id."""
    return {r.dag_id: _row(r) for r in conn.execute(_select())}


def version_ids_due_by(conn: Connection, *, until: datetime) -> set[int]:
    """Latest version ids of unpaused, active DAGs whose next fire time is at or before `until`."""
    stmt = (
        sa.select(dags.c.latest_version_id)
        .select_from(schedules.join(dags, dags.c.dag_id == schedules.c.dag_id))
        .where(
            schedules.c.next_fire_at <= until,
            dags.c.is_paused == sa.false(),
            dags.c.is_active == sa.true(),
            dags.c.latest_version_id.is_not(None),
        )
        .distinct()
    )
    return {int(v) for v in conn.execute(stmt).scalars()}
