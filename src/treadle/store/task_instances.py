"""Queries on task instances: creation, claiming, guarded state changes, readiness counters."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.records import TaskInstanceInfo
from treadle.domain.states import TaskState
from treadle.store import dialects
from treadle.store.tables import UTCDateTime
from treadle.store.tables import task_instances as ti

_INFO_COLUMNS = [ti.c[name] for name in TaskInstanceInfo.__dataclass_fields__]
#: What identifies an attempt and its retry budget (claims and the reaper read these).
_ATTEMPT_COLUMNS = (
    ti.c.id,
    ti.c.run_id,
    ti.c.dag_id,
    ti.c.task_id,
    ti.c.attempt,
    ti.c.budget_base,
    ti.c.orphaned_count,
)


def stamp(now: datetime | None, *, plus: timedelta | None = None) -> Any:
    """The database time a statement writes (`+ plus`): `now`, read from the database, or when
    None PostgreSQL's `statement_timestamp()`, one value for every row of the statement.

    Hot-path statements pass None on PostgreSQL and RETURN the stamped column, which saves the
    separate clock query per transaction while keeping the database the only clock.
    """
    if now is None:
        expr = sa.func.statement_timestamp(type_=UTCDateTime())
        return expr if plus is None else expr + sa.literal(plus, sa.Interval())
    return sa.literal(now if plus is None else now + plus, UTCDateTime())


def insert_task_instances(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert the task instances of a new run (columns of `task_instances`)."""
    conn.execute(sa.insert(ti), rows)


def claim(
    conn: Connection,
    *,
    worker_id: str,
    hostname: str,
    queues: list[str],
    limit: int,
    now: datetime | None,
    lease_s: float,
) -> list[sa.Row[Any]]:
    """Move up to `limit` queued task instances to running for this worker, highest priority first.

    The selection is materialised before the UPDATE so `LIMIT` is honoured under concurrent
    claimers (F14), and locked rows are skipped rather than waited on. `now` None stamps the
    rows with the statement's database time (see `stamp`); each row returns its `started_at`.
    """
    sel = (
        sa.select(ti.c.id)
        .where(ti.c.state == TaskState.QUEUED.value, ti.c.queue.in_(queues))
        .order_by(ti.c.priority_weight.desc(), ti.c.queued_at, ti.c.id)
        .limit(limit)
    )
    picked = (
        dialects.lock_for_claim(sel, conn).cte("picked").prefix_with("MATERIALIZED", dialect="postgresql")
    )
    stmt = (
        sa.update(ti)
        .where(ti.c.id.in_(sa.select(picked.c.id)), ti.c.state == TaskState.QUEUED.value)
        .values(
            state=TaskState.RUNNING.value,
            attempt=ti.c.attempt + 1,
            worker_id=worker_id,
            hostname=hostname,
            started_at=stamp(now),
            ended_at=None,
            lease_expires_at=stamp(now, plus=timedelta(seconds=lease_s)),
            next_attempt_at=None,
        )
        .returning(ti.c.started_at, ti.c.timeout_s, *_ATTEMPT_COLUMNS)
    )
    rows = list(conn.execute(stmt))
    timed = [
        {"b_id": r.id, "b_at": r.started_at + timedelta(seconds=r.timeout_s)} for r in rows if r.timeout_s
    ]
    if timed:
        conn.execute(
            sa.update(ti).where(ti.c.id == sa.bindparam("b_id")).values(timeout_at=sa.bindparam("b_at")),
            timed,
        )
    return rows


def _guard(
    stmt: sa.Update,
    *,
    task_instance_id: int,
    attempt: int,
    worker_id: str | None,
    lease_expired_before: datetime | None,
) -> sa.Update:
    stmt = stmt.where(
        ti.c.id == task_instance_id, ti.c.state == TaskState.RUNNING.value, ti.c.attempt == attempt
    )
    if worker_id is not None:
        stmt = stmt.where(ti.c.worker_id == worker_id)
    if lease_expired_before is not None:
        stmt = stmt.where(ti.c.lease_expires_at < lease_expired_before)
    return stmt


def end_running(
    conn: Connection,
    *,
    task_instance_id: int,
    attempt: int,
    new_state: TaskState,
    now: datetime,
    worker_id: str | None = None,
    lease_expired_before: datetime | None = None,
    next_attempt_at: datetime | None = None,
    dead_letter_reason: str | None = None,
    orphaned: bool = False,
) -> bool:
    """Compare-and-set running -> `new_state` for one attempt; False if another party moved it.

    `worker_id` fences a worker's report; `lease_expired_before` fences the reaper.
    """
    values: dict[str, Any] = {
        "state": new_state.value,
        "ended_at": now,
        "lease_expires_at": None,
        "next_attempt_at": next_attempt_at,
        "dead_letter_reason": dead_letter_reason,
    }
    if orphaned:
        values["orphaned_count"] = ti.c.orphaned_count + 1
    stmt = _guard(
        sa.update(ti).values(**values),
        task_instance_id=task_instance_id,
        attempt=attempt,
        worker_id=worker_id,
        lease_expired_before=lease_expired_before,
    )
    return bool(conn.execute(stmt).rowcount)


def end_running_many(
    conn: Connection,
    *,
    held: list[tuple[int, int]],
    new_state: TaskState,
    worker_id: str,
    now: datetime | None,
) -> dict[tuple[int, int], datetime]:
    """Compare-and-set running -> `new_state` for several attempts this worker holds, in one statement.

    Each row must still be running at the named attempt under `worker_id` (the fence); returns
    the (id, attempt) pairs that moved, with the `ended_at` written. The rest were lost.
    """
    if not held:
        return {}
    stmt = (
        sa.update(ti)
        .where(
            sa.tuple_(ti.c.id, ti.c.attempt).in_(held),
            ti.c.state == TaskState.RUNNING.value,
            ti.c.worker_id == worker_id,
        )
        .values(
            state=new_state.value,
            ended_at=stamp(now),
            lease_expires_at=None,
            next_attempt_at=None,
            dead_letter_reason=None,
        )
        .returning(ti.c.id, ti.c.attempt, ti.c.ended_at)
    )
    return {(r.id, r.attempt): r.ended_at for r in conn.execute(stmt)}


def count_upstream_successes(
    conn: Connection, *, increments: Mapping[tuple[str, str], int], now: datetime | None
) -> bool:
    """Add succeeded upstreams to downstream counters and queue the rows that became ready.

    `increments` maps (run id, downstream task id) to how many of its upstreams just succeeded.
    Counter and state move in the same UPDATE (SET expressions read the row's old values), so
    a fan-in row is queued exactly by the completion that fills its counter; concurrent
    completions serialise on the row lock and re-read it. Returns True if any row is queued.
    """
    groups: dict[tuple[str, int], list[str]] = {}
    for (run_id, task_id), n in increments.items():
        groups.setdefault((run_id, n), []).append(task_id)
    queued = False
    for (run_id, n), task_ids in sorted(groups.items()):
        ready = sa.and_(ti.c.state == TaskState.PENDING.value, ti.c.upstream_done + n >= ti.c.upstream_total)
        rows = conn.execute(
            sa.update(ti)
            .where(ti.c.run_id == run_id, ti.c.task_id.in_(sorted(task_ids)))
            .values(
                upstream_done=ti.c.upstream_done + n,
                state=sa.case((ready, TaskState.QUEUED.value), else_=ti.c.state),
                queued_at=sa.case((ready, stamp(now)), else_=ti.c.queued_at),
            )
            .returning(ti.c.state)
        )
        queued = any(r.state == TaskState.QUEUED.value for r in rows) or queued
    return queued


def mark_upstream_failed(conn: Connection, *, run_id: str, task_ids: list[str], now: datetime) -> int:
    """Move pending task instances of a run to upstream_failed."""
    if not task_ids:
        return 0
    result = conn.execute(
        sa.update(ti)
        .where(ti.c.run_id == run_id, ti.c.task_id.in_(task_ids), ti.c.state == TaskState.PENDING.value)
        .values(state=TaskState.UPSTREAM_FAILED.value, ended_at=now)
    )
    return int(result.rowcount)


def reset_to_pending(conn: Connection, *, run_id: str, task_ids: list[str]) -> int:
    """Move upstream_failed task instances of a run back to pending (after a requeue)."""
    if not task_ids:
        return 0
    result = conn.execute(
        sa.update(ti)
        .where(
            ti.c.run_id == run_id,
            ti.c.task_id.in_(task_ids),
            ti.c.state == TaskState.UPSTREAM_FAILED.value,
        )
        .values(state=TaskState.PENDING.value, ended_at=None)
    )
    return int(result.rowcount)


def requeue_dead_letter(conn: Connection, *, task_instance_id: int, now: datetime) -> bool:
    """dead_letter -> queued with a fresh retry budget; False if it is no longer a dead letter."""
    result = conn.execute(
        sa.update(ti)
        .where(ti.c.id == task_instance_id, ti.c.state == TaskState.DEAD_LETTER.value)
        .values(
            state=TaskState.QUEUED.value,
            queued_at=now,
            budget_base=ti.c.attempt,
            orphaned_count=0,
            dead_letter_reason=None,
            ended_at=None,
            worker_id=None,
        )
    )
    return bool(result.rowcount)


def promote_due_retries(conn: Connection, *, now: datetime, limit: int = 1000) -> int:
    """retry_wait -> queued for every task instance whose next attempt is due."""
    due = (
        sa.select(ti.c.id)
        .where(ti.c.state == TaskState.RETRY_WAIT.value, ti.c.next_attempt_at <= now)
        .limit(limit)
        .scalar_subquery()
    )
    result = conn.execute(
        sa.update(ti)
        .where(ti.c.id.in_(due), ti.c.state == TaskState.RETRY_WAIT.value)
        .values(state=TaskState.QUEUED.value, queued_at=now, next_attempt_at=None)
    )
    return int(result.rowcount)


def expired_leases(conn: Connection, *, now: datetime, limit: int) -> list[sa.Row[Any]]:
    """Return running task instances whose lease has expired (the reaper's evidence)."""
    stmt = (
        sa.select(
            *_ATTEMPT_COLUMNS,
            ti.c.worker_id,
            ti.c.hostname,
            ti.c.started_at,
            ti.c.lease_expires_at,
        )
        .where(ti.c.state == TaskState.RUNNING.value, ti.c.lease_expires_at < now)
        .order_by(ti.c.lease_expires_at)
        .limit(limit)
    )
    return list(conn.execute(stmt))


def extend_leases(
    conn: Connection, *, worker_id: str, held: list[tuple[int, int]], now: datetime, lease_s: float
) -> set[tuple[int, int]]:
    """Extend the leases this worker still holds; returns the (id, attempt) pairs renewed."""
    if not held:
        return set()
    ids = [i for i, _ in held]
    rows = conn.execute(
        sa.update(ti)
        .where(ti.c.id.in_(ids), ti.c.worker_id == worker_id, ti.c.state == TaskState.RUNNING.value)
        .values(lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(ti.c.id, ti.c.attempt)
    )
    renewed = {(r.id, r.attempt) for r in rows}
    return renewed & set(held)


def get_task_instance(conn: Connection, task_instance_id: int) -> TaskInstanceInfo | None:
    """Return one task instance, or None."""
    row = conn.execute(sa.select(*_INFO_COLUMNS).where(ti.c.id == task_instance_id)).first()
    return TaskInstanceInfo(**row._mapping) if row else None


def list_for_run(conn: Connection, run_id: str) -> list[TaskInstanceInfo]:
    """Return every task instance of a run."""
    rows = conn.execute(sa.select(*_INFO_COLUMNS).where(ti.c.run_id == run_id).order_by(ti.c.id))
    return [TaskInstanceInfo(**r._mapping) for r in rows]


def list_dead_letters(conn: Connection, *, limit: int) -> list[TaskInstanceInfo]:
    """Return dead-lettered task instances, newest first."""
    rows = conn.execute(
        sa.select(*_INFO_COLUMNS)
        .where(ti.c.state == TaskState.DEAD_LETTER.value)
        .order_by(ti.c.ended_at.desc())
        .limit(limit)
    )
    return [TaskInstanceInfo(**r._mapping) for r in rows]
