"""Queries for cancelling task instances (guarded: only active ones move)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.domain.task_records import ActiveInstance
from treadle.domain.transitions import UseCase, task_sources
from treadle.store import dialects
from treadle.store.tables import task_instances as ti

#: What a cancel may move to cancelled: every active state.
_ACTIVE = task_sources(UseCase.CANCEL, TaskState.CANCELLED)


def active_instances(conn: Connection, *, run_id: str, task_ids: list[str] | None) -> list[ActiveInstance]:
    """Active task instances of a run (all, or the given tasks), locked for the cancel."""
    stmt = sa.select(
        ti.c.id,
        ti.c.task_id,
        ti.c.state,
        ti.c.attempt,
        ti.c.worker_id,
        ti.c.hostname,
        ti.c.started_at,
        ti.c.map_index,
    ).where(ti.c.run_id == run_id, ti.c.state.in_(_ACTIVE))
    if task_ids is not None:
        stmt = stmt.where(ti.c.task_id.in_(task_ids))
    rows = conn.execute(dialects.lock_row(stmt.order_by(ti.c.id), conn))
    return [ActiveInstance(**r._mapping) for r in rows]


def task_states(conn: Connection, *, run_id: str, task_ids: list[str]) -> set[tuple[str, str]]:
    """The (task, state) pairs of the given tasks' instances in a run."""
    if not task_ids:
        return set()
    stmt = sa.select(ti.c.task_id, ti.c.state).where(ti.c.run_id == run_id, ti.c.task_id.in_(task_ids))
    return {(r.task_id, r.state) for r in conn.execute(stmt)}


def cancel_instances(conn: Connection, *, ids: list[int], now: datetime) -> int:
    """Move the given task instances to cancelled if they are still active."""
    if not ids:
        return 0
    result = conn.execute(
        sa.update(ti)
        .where(ti.c.id.in_(ids), ti.c.state.in_(_ACTIVE))
        .values(
            state=TaskState.CANCELLED.value,
            ended_at=now,
            lease_expires_at=None,
            next_attempt_at=None,
            dispatch_deadline=None,
        )
    )
    return int(result.rowcount)
