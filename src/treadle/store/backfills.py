"""Backfills (requests to run a DAG over past intervals) and clearing task instances to run again.

The clearing queries live here because backfill reruns are their second user; each state change
is a compare-and-set on the state (and attempt) the caller read under a row lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.records import RunInfo
from treadle.domain.states import RunState, RunType
from treadle.store import dialects
from treadle.store.tables import backfills, dag_runs

#: Run states that count against a backfill's max_active.
ACTIVE_RUN_STATES = (RunState.QUEUED.value, RunState.RUNNING.value)
#: Run types whose runs stand for an interval: a backfill skips or reruns them.
INTERVAL_RUN_TYPES = (RunType.SCHEDULED.value, RunType.BACKFILL.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillInfo:
    """One backfill row."""

    id: int
    dag_id: str
    #: Logical dates from .. to (inclusive) of the intervals to run.
    from_date: datetime
    to_date: datetime
    reason: str
    requested_by: str
    #: normal or shadow.
    mode: str
    #: none, failed or all.
    rerun: str
    max_active: int
    #: running, paused, cancelled or done.
    state: str
    total: int
    handled: int
    #: Fire time of the next interval to handle; None once every interval is handled.
    cursor: datetime | None
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None


def _info(row: sa.Row[Any]) -> BackfillInfo:
    return BackfillInfo(**row._mapping)


def insert_backfill(conn: Connection, **values: Any) -> int:
    """Insert a backfill row (columns of `backfills`); returns its id."""
    result = conn.execute(sa.insert(backfills).values(**values))
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def get_backfill(conn: Connection, backfill_id: int, *, lock: bool = False) -> BackfillInfo | None:
    """Return one backfill, or None; `lock` holds its row until the transaction ends."""
    stmt = sa.select(backfills).where(backfills.c.id == backfill_id)
    row = conn.execute(dialects.lock_row(stmt, conn) if lock else stmt).first()
    return _info(row) if row else None


def list_backfills(conn: Connection, *, dag_id: str | None, limit: int) -> list[BackfillInfo]:
    """Return the newest backfills, optionally of one DAG."""
    stmt = sa.select(backfills).order_by(backfills.c.created_at.desc(), backfills.c.id.desc()).limit(limit)
    if dag_id is not None:
        stmt = stmt.where(backfills.c.dag_id == dag_id)
    return [_info(r) for r in conn.execute(stmt)]


def lock_running(conn: Connection) -> list[BackfillInfo]:
    """Every running backfill, oldest first, locked so pause/cancel wait for the drain."""
    stmt = sa.select(backfills).where(backfills.c.state == "running").order_by(backfills.c.id)
    return [_info(r) for r in conn.execute(dialects.lock_row(stmt, conn))]


def advance(
    conn: Connection,
    backfill_id: int,
    *,
    expected_cursor: datetime | None,
    expected_handled: int,
    cursor: datetime | None,
    handled: int,
    now: datetime,
) -> bool:
    """Compare-and-set a running backfill's cursor and handled count."""
    cursor_is = (
        backfills.c.cursor.is_(None) if expected_cursor is None else backfills.c.cursor == expected_cursor
    )
    result = conn.execute(
        sa.update(backfills)
        .where(
            backfills.c.id == backfill_id,
            backfills.c.state == "running",
            backfills.c.handled == expected_handled,
            cursor_is,
        )
        .values(cursor=cursor, handled=handled, updated_at=now)
    )
    return bool(result.rowcount)


def set_state(
    conn: Connection, backfill_id: int, *, expected: Sequence[str], new: str, now: datetime
) -> bool:
    """Compare-and-set a backfill's state; done and cancelled also set ended_at."""
    values: dict[str, Any] = {"state": new, "updated_at": now}
    if new in ("done", "cancelled"):
        values["ended_at"] = now
    result = conn.execute(
        sa.update(backfills)
        .where(backfills.c.id == backfill_id, backfills.c.state.in_(list(expected)))
        .values(**values)
    )
    return bool(result.rowcount)


def active_run_counts(conn: Connection, backfill_ids: Sequence[int]) -> dict[int, int]:
    """Queued or running runs per backfill."""
    if not backfill_ids:
        return {}
    stmt = (
        sa.select(dag_runs.c.backfill_id, sa.func.count())
        .where(dag_runs.c.backfill_id.in_(sorted(set(backfill_ids))), dag_runs.c.state.in_(ACTIVE_RUN_STATES))
        .group_by(dag_runs.c.backfill_id)
    )
    return {int(r[0]): int(r[1]) for r in conn.execute(stmt)}


def run_state_counts(conn: Connection, backfill_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """Runs per backfill and state."""
    if not backfill_ids:
        return {}
    stmt = (
        sa.select(dag_runs.c.backfill_id, dag_runs.c.state, sa.func.count())
        .where(dag_runs.c.backfill_id.in_(sorted(set(backfill_ids))))
        .group_by(dag_runs.c.backfill_id, dag_runs.c.state)
    )
    counts: dict[int, dict[str, int]] = {}
    for backfill_id, state, n in conn.execute(stmt):
        counts.setdefault(int(backfill_id), {})[state] = int(n)
    return counts


def runs_of(conn: Connection, backfill_id: int, *, active_only: bool = False) -> list[RunInfo]:
    """Runs counted against a backfill, by logical date."""
    stmt = sa.select(dag_runs).where(dag_runs.c.backfill_id == backfill_id).order_by(dag_runs.c.logical_date)
    if active_only:
        stmt = stmt.where(dag_runs.c.state.in_(ACTIVE_RUN_STATES))
    return [RunInfo(**r._mapping) for r in conn.execute(stmt)]


def interval_runs(
    conn: Connection, dag_id: str, logical_dates: Sequence[datetime]
) -> dict[datetime, RunInfo]:
    """The newest scheduled or backfill run of each given logical date that has one."""
    if not logical_dates:
        return {}
    stmt = (
        sa.select(dag_runs)
        .where(
            dag_runs.c.dag_id == dag_id,
            dag_runs.c.logical_date >= min(logical_dates),
            dag_runs.c.logical_date <= max(logical_dates),
            dag_runs.c.run_type.in_(INTERVAL_RUN_TYPES),
        )
        .order_by(dag_runs.c.created_at, dag_runs.c.run_id)
    )
    wanted = set(logical_dates)
    found: dict[datetime, RunInfo] = {}
    for row in conn.execute(stmt):
        run = RunInfo(**row._mapping)
        if run.logical_date in wanted:
            found[run.logical_date] = run  # later rows are newer
    return found


def adopt_run(conn: Connection, run_id: str, backfill_id: int) -> bool:
    """Count an existing run (reopened by a rerun) against a backfill's budget."""
    result = conn.execute(
        sa.update(dag_runs).where(dag_runs.c.run_id == run_id).values(backfill_id=backfill_id)
    )
    return bool(result.rowcount)
