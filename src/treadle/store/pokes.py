"""Queries for sensors and submit-then-poll tasks: the reschedule between pokes, the poke state."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import AttemptOutcome, TaskState
from treadle.domain.transitions import UseCase, task_sources
from treadle.store.tables import dag_runs, dataset_events
from treadle.store.tables import task_attempts as ta
from treadle.store.tables import task_instances as ti


@dataclass(frozen=True, slots=True, kw_only=True)
class PokeRow:
    """What the next poke of a task instance starts from."""

    state: str
    attempt: int
    first_poke_at: datetime | None
    #: A submitted job's handle or a sensor's state. Any: JSON.
    poll_handle: Any
    next_attempt_at: datetime | None


def poke_row(conn: Connection, task_instance_id: int) -> PokeRow | None:
    """The poke columns of one task instance (None if it is gone)."""
    row = conn.execute(
        sa.select(ti.c.state, ti.c.attempt, ti.c.first_poke_at, ti.c.poll_handle, ti.c.next_attempt_at).where(
            ti.c.id == task_instance_id
        )
    ).one_or_none()
    return None if row is None else PokeRow(**row._mapping)


def reschedule(
    conn: Connection,
    *,
    task_instance_id: int,
    attempt: int,
    worker_id: str,
    now: datetime,
    first_poke_at: datetime,
    next_attempt_at: datetime,
    poll_handle: Any,
) -> bool:
    """Compare-and-set running -> up_for_reschedule for the attempt this worker holds.

    The poke spends no retry: the budget's base moves on by one, as a hand-back's does. The
    handle (or sensor state) is written in the same statement, so a job submitted by this attempt
    is known exactly when its reschedule is.
    """
    result = conn.execute(
        sa.update(ti)
        .where(
            ti.c.id == task_instance_id,
            ti.c.attempt == attempt,
            ti.c.worker_id == worker_id,
            ti.c.state.in_(task_sources(UseCase.RESCHEDULE, TaskState.UP_FOR_RESCHEDULE)),
        )
        .values(
            state=TaskState.UP_FOR_RESCHEDULE.value,
            budget_base=ti.c.budget_base + 1,
            next_attempt_at=next_attempt_at,
            first_poke_at=sa.func.coalesce(
                ti.c.first_poke_at, sa.literal(first_poke_at, ti.c.first_poke_at.type)
            ),
            poll_handle=sa.null() if poll_handle is None else sa.literal(poll_handle, ti.c.poll_handle.type),
            lease_expires_at=None,
            timeout_at=None,
            dispatch_deadline=None,
            worker_id=None,
        )
    )
    return bool(result.rowcount)


def forget_poll_state(conn: Connection, *, task_instance_id: int) -> None:
    """Start the next attempt from scratch: no job handle, no first poke (a job that ended, a
    requeue or a clear)."""
    conn.execute(
        sa.update(ti)
        .where(ti.c.id == task_instance_id, ti.c.poll_handle.is_not(None) | ti.c.first_poke_at.is_not(None))
        .values(poll_handle=sa.null(), first_poke_at=None)
    )


def count_pokes(conn: Connection, *, task_instance_id: int) -> int:
    """Attempts of a task instance that ended `rescheduled` (its pokes that found it not ready)."""
    return int(
        conn.execute(
            sa.select(sa.func.count())
            .select_from(ta)
            .where(
                ta.c.task_instance_id == task_instance_id, ta.c.outcome == AttemptOutcome.RESCHEDULED.value
            )
        ).scalar_one()
    )


def dataset_event_covering(
    conn: Connection, dataset: str, *, start: datetime, end: datetime
) -> dict[str, Any] | None:
    """The newest event on `dataset` recorded by a run whose data interval covers [start, end)."""
    e, r = dataset_events.c, dag_runs.c
    row = conn.execute(
        sa.select(e.id, e.run_id, e.dag_id, e.task_id, e.version, e.created_at)
        .select_from(dataset_events.join(dag_runs, dag_runs.c.run_id == e.run_id))
        .where(e.dataset == dataset, r.data_interval_start <= start, r.data_interval_end >= end)
        .order_by(e.id.desc())
        .limit(1)
    ).one_or_none()
    return None if row is None else dict(row._mapping)
