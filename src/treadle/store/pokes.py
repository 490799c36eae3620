"""Queries for sensors and submit-then-poll tasks: the reschedule between pokes, the poke state."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import AttemptOutcome, TaskState
from treadle.domain.transitions import UseCase, task_sources
from treadle.store import dialects
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RescheduleRow:
    """One poke's reschedule for `reschedule_many`: the attempt, its next poke, its record."""

    task_instance_id: int
    attempt: int
    first_poke_at: datetime
    next_attempt_at: datetime
    poll_handle: Any
    run_id: str
    dag_id: str
    task_id: str
    started_at: datetime | None
    code_version: str | None
    evidence: dict[str, Any] | None


def _reschedule_many_statement() -> sa.TextualSelect:
    sources = ", ".join(
        f"'{state}'" for state in task_sources(UseCase.RESCHEDULE, TaskState.UP_FOR_RESCHEDULE)
    )
    sql = f"""
WITH v AS (
    SELECT * FROM unnest(
        CAST(:ids AS BIGINT[]), CAST(:attempts AS INTEGER[]), CAST(:firsts AS TIMESTAMPTZ[]),
        CAST(:nexts AS TIMESTAMPTZ[]), CAST(:handles AS TEXT[]), CAST(:run_ids AS TEXT[]),
        CAST(:dag_ids AS TEXT[]), CAST(:task_ids AS TEXT[]), CAST(:started AS TIMESTAMPTZ[]),
        CAST(:code_versions AS TEXT[]), CAST(:outputs AS TEXT[])
    ) AS v(id, attempt, first_poke_at, next_attempt_at, handle, run_id, dag_id, task_id, started_at,
           code_version, outputs)
),
moved AS (
    UPDATE task_instances AS t
    SET state = '{TaskState.UP_FOR_RESCHEDULE.value}', budget_base = t.budget_base + 1,
        next_attempt_at = v.next_attempt_at, first_poke_at = COALESCE(t.first_poke_at, v.first_poke_at),
        poll_handle = CAST(v.handle AS JSONB), lease_expires_at = NULL, timeout_at = NULL,
        dispatch_deadline = NULL, worker_id = NULL
    FROM v
    WHERE t.id = v.id AND t.attempt = v.attempt AND t.worker_id = :worker AND t.state IN ({sources})
    RETURNING t.id, t.attempt
),
recorded AS (
    INSERT INTO task_attempts (task_instance_id, run_id, dag_id, task_id, attempt, outcome,
        worker_id, hostname, started_at, ended_at, duration_s, code_version, outputs)
    SELECT v.id, v.run_id, v.dag_id, v.task_id, v.attempt, '{AttemptOutcome.RESCHEDULED.value}',
        :attempt_worker, :attempt_host, v.started_at, CAST(:now AS TIMESTAMPTZ),
        CASE WHEN v.started_at IS NOT NULL THEN CAST(
            GREATEST(EXTRACT(EPOCH FROM (CAST(:now AS TIMESTAMPTZ) - v.started_at)), 0) AS DOUBLE PRECISION
        ) END,
        v.code_version, CAST(v.outputs AS JSONB)
    FROM v JOIN moved AS m ON m.id = v.id AND m.attempt = v.attempt
)
SELECT id, attempt FROM moved
"""
    return sa.text(sql).columns(sa.column("id", sa.BigInteger()), sa.column("attempt", sa.Integer()))


def reschedule_many(
    conn: Connection, rows: list[RescheduleRow], *, worker_id: str, hostname: str, now: datetime
) -> set[tuple[int, int]]:
    """`reschedule` and the `rescheduled` attempt row of every poke in `rows` in one statement
    (only where `dialects.has_writable_ctes`); returns the (id, attempt) pairs that moved."""
    stmt = dialects.built_once(conn, "reschedule many", _reschedule_many_statement)
    params = {
        "ids": [r.task_instance_id for r in rows],
        "attempts": [r.attempt for r in rows],
        "firsts": [r.first_poke_at for r in rows],
        "nexts": [r.next_attempt_at for r in rows],
        # A missing handle is SQL NULL, as `reschedule` writes it; the outputs as the JSON column
        # type stores them (None is JSON null).
        "handles": [None if r.poll_handle is None else json.dumps(r.poll_handle) for r in rows],
        "run_ids": [r.run_id for r in rows],
        "dag_ids": [r.dag_id for r in rows],
        "task_ids": [r.task_id for r in rows],
        "started": [r.started_at for r in rows],
        "code_versions": [r.code_version for r in rows],
        "outputs": [json.dumps(r.evidence) for r in rows],
        "worker": worker_id,
        "attempt_worker": worker_id or None,
        "attempt_host": hostname or None,
        "now": now,
    }
    return {(r.id, r.attempt) for r in conn.execute(stmt, params)}


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
