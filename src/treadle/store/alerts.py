"""Alert firings (one per rule and occurrence, the newest sent one per rule and subject for
deduplication) and the reads the leader's alert check makes: instances awaiting inspection or
retried often, runs and backfills past a budget, a DAG's latest run outcomes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import RunState, RunType, TaskState
from treadle.store.tables import alert_firings, backfills, dag_runs, task_instances


@dataclass(frozen=True, slots=True, kw_only=True)
class Firing:
    """One rule's alert about one occurrence, sent or not."""

    key: str
    rule: str
    subject: str
    kind: str
    dag_id: str
    run_id: str | None
    disposition: str
    fired_at: datetime


def fired_keys(conn: Connection, keys: Iterable[str]) -> set[str]:
    """Those of `keys` that already fired."""
    wanted = sorted(set(keys))
    if not wanted:
        return set()
    stmt = sa.select(alert_firings.c.key).where(alert_firings.c.key.in_(wanted))
    return set(conn.execute(stmt).scalars())


def last_sent_at(conn: Connection, *, rule: str, subject: str) -> datetime | None:
    """When `rule` last sent an alert about `subject`."""
    stmt = sa.select(sa.func.max(alert_firings.c.fired_at)).where(
        alert_firings.c.rule == rule,
        alert_firings.c.subject == subject,
        alert_firings.c.disposition == "sent",
    )
    value = conn.execute(stmt).scalar()
    if isinstance(value, str):  # MAX() over a time column is text on SQLite
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value if isinstance(value, datetime) else None


def record(conn: Connection, firing: Firing) -> None:
    """Note one firing (the caller checked its key is new, under the leader lease or in the
    transaction of the change it is about)."""
    conn.execute(
        sa.insert(alert_firings).values(
            key=firing.key,
            rule=firing.rule[:120],
            subject=firing.subject[:500],
            kind=firing.kind,
            dag_id=firing.dag_id,
            run_id=firing.run_id,
            disposition=firing.disposition,
            fired_at=firing.fired_at,
        )
    )


def firings(conn: Connection, *, limit: int = 100) -> list[Firing]:
    """The newest firings, newest first."""
    stmt = sa.select(alert_firings).order_by(alert_firings.c.fired_at.desc()).limit(limit)
    return [Firing(**r._mapping) for r in conn.execute(stmt)]


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceRow:
    """A task instance an alert may be about, with its run's type."""

    run_id: str
    dag_id: str
    task_id: str
    map_index: int
    state: str
    attempt: int
    budget_base: int
    run_type: str


def _instances(conn: Connection, *conditions: sa.ColumnElement[bool]) -> list[InstanceRow]:
    ti = task_instances
    stmt = (
        sa.select(
            ti.c.run_id,
            ti.c.dag_id,
            ti.c.task_id,
            ti.c.map_index,
            ti.c.state,
            ti.c.attempt,
            ti.c.budget_base,
            dag_runs.c.run_type,
        )
        .select_from(ti.join(dag_runs, dag_runs.c.run_id == ti.c.run_id))
        .where(*conditions)
    )
    return [InstanceRow(**r._mapping) for r in conn.execute(stmt)]


def awaiting_inspection(conn: Connection, dag_ids: Sequence[str] | None) -> list[InstanceRow]:
    """Instances in needs_inspection (of `dag_ids`, or of every DAG when None)."""
    conditions = [task_instances.c.state == TaskState.NEEDS_INSPECTION.value]
    if dag_ids is not None:
        conditions.append(task_instances.c.dag_id.in_(list(dag_ids)))
    return _instances(conn, *conditions)


def retried(conn: Connection, *, at_least: int, dag_ids: Sequence[str] | None) -> list[InstanceRow]:
    """Active instances retried `at_least` times within their current budget: waiting for a
    retry after that many failed attempts, or running or queued for the one after."""
    ti = task_instances
    spent = ti.c.attempt - ti.c.budget_base
    conditions = [
        sa.or_(
            sa.and_(ti.c.state == TaskState.RETRY_WAIT.value, spent >= at_least),
            sa.and_(ti.c.state.in_([TaskState.QUEUED.value, TaskState.RUNNING.value]), spent >= at_least + 1),
        )
    ]
    if dag_ids is not None:
        conditions.append(ti.c.dag_id.in_(list(dag_ids)))
    return _instances(conn, *conditions)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    """A run an alert may be about."""

    run_id: str
    dag_id: str
    run_type: str
    state: str
    started_at: datetime | None
    ended_at: datetime | None


def _runs(conn: Connection, stmt: sa.Select[tuple[str, str, str, str, datetime, datetime]]) -> list[RunRow]:
    return [RunRow(**r._mapping) for r in conn.execute(stmt)]


_RUN_COLUMNS = (
    dag_runs.c.run_id,
    dag_runs.c.dag_id,
    dag_runs.c.run_type,
    dag_runs.c.state,
    dag_runs.c.started_at,
    dag_runs.c.ended_at,
)


def running_since_before(
    conn: Connection, *, before: datetime, dag_ids: Sequence[str] | None
) -> list[RunRow]:
    """Running runs that started before `before`."""
    stmt = sa.select(*_RUN_COLUMNS).where(
        dag_runs.c.state == RunState.RUNNING.value, dag_runs.c.started_at < before
    )
    if dag_ids is not None:
        stmt = stmt.where(dag_runs.c.dag_id.in_(list(dag_ids)))
    return _runs(conn, stmt)


def latest_ended(conn: Connection, dag_id: str, *, limit: int) -> list[RunRow]:
    """The DAG's `limit` newest ended runs that are not backfills, newest first (cancelled
    runs are left out: they say nothing about the pipeline's health).

    Meant for the (dag_id, created_at) index, walked backwards until `limit` rows match; `state
    || ''` keeps a planner without statistics (SQLite) from taking the (dag_id, state) index
    instead, which would read every ended run of the DAG and sort them."""
    stmt = (
        sa.select(*_RUN_COLUMNS)
        .where(
            dag_runs.c.dag_id == dag_id,
            dag_runs.c.state.concat("").in_([RunState.SUCCESS.value, RunState.FAILED.value]),
            dag_runs.c.run_type != RunType.BACKFILL.value,
        )
        .order_by(dag_runs.c.created_at.desc(), dag_runs.c.run_id.desc())
        .limit(limit)
    )
    return _runs(conn, stmt)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillRow:
    """A running backfill."""

    id: int
    dag_id: str
    created_at: datetime
    total: int
    handled: int


def running_backfills(conn: Connection, *, created_before: datetime) -> list[BackfillRow]:
    """Backfills running (or paused) since before `created_before`."""
    stmt = sa.select(
        backfills.c.id, backfills.c.dag_id, backfills.c.created_at, backfills.c.total, backfills.c.handled
    ).where(backfills.c.state.in_(["running", "paused"]), backfills.c.created_at < created_before)
    return [BackfillRow(**r._mapping) for r in conn.execute(stmt)]
