"""Queries on task instances: creation, claiming, guarded state changes, readiness counters."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.records import TaskInstanceInfo
from treadle.domain.states import TaskState
from treadle.store import dialects
from treadle.store.tables import task_instances as ti

_INFO_COLUMNS = [ti.c[name] for name in TaskInstanceInfo.__dataclass_fields__]


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
    now: datetime,
    lease_s: float,
) -> list[sa.Row[Any]]:
    """Move up to `limit` queued task instances to running for this worker, highest priority first.

    The selection is materialised before the UPDATE so `LIMIT` is honoured under concurrent
    claimers (F14), and locked rows are skipped rather than waited on.
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
            started_at=now,
            ended_at=None,
            lease_expires_at=now + timedelta(seconds=lease_s),
            next_attempt_at=None,
        )
        .returning(
            ti.c.id,
            ti.c.run_id,
            ti.c.dag_id,
            ti.c.task_id,
            ti.c.attempt,
            ti.c.budget_base,
            ti.c.orphaned_count,
            ti.c.timeout_s,
        )
    )
    rows = list(conn.execute(stmt))
    timed = [{"b_id": r.id, "b_at": now + timedelta(seconds=r.timeout_s)} for r in rows if r.timeout_s]
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


def count_upstream_success(conn: Connection, *, run_id: str, downstream: list[str], now: datetime) -> int:
    """Count one more succeeded upstream on each downstream task; queue those now ready.

    Both statements run in the caller's transaction, so counter and state move together; a run's
    cost grows with its edges, not with polling. Returns how many became queued.
    """
    if not downstream:
        return 0
    conn.execute(
        sa.update(ti)
        .where(ti.c.run_id == run_id, ti.c.task_id.in_(downstream))
        .values(upstream_done=ti.c.upstream_done + 1)
    )
    result = conn.execute(
        sa.update(ti)
        .where(
            ti.c.run_id == run_id,
            ti.c.task_id.in_(downstream),
            ti.c.state == TaskState.PENDING.value,
            ti.c.upstream_done >= ti.c.upstream_total,
        )
        .values(state=TaskState.QUEUED.value, queued_at=now)
    )
    return int(result.rowcount)


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
            ti.c.id,
            ti.c.run_id,
            ti.c.dag_id,
            ti.c.task_id,
            ti.c.attempt,
            ti.c.budget_base,
            ti.c.orphaned_count,
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
