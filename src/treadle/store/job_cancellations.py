"""Queries for owed cancels of submitted external jobs (`job_cancellations`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store import dialects
from treadle.store.tables import job_cancellations as jc
from treadle.store.tables import task_instances as ti


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCancellation:
    """One job whose cancel a worker owes."""

    id: int
    task_instance_id: int
    run_id: str
    dag_id: str
    task_id: str
    dag_version_id: int
    queue: str
    handle: Any  # Any: the job's JSON handle
    reason: str
    tries: int


_COLUMNS = [jc.c[name] for name in JobCancellation.__dataclass_fields__]


def handles_of(conn: Connection, ids: list[int]) -> list[dict[str, Any]]:
    """Task instances among `ids` that hold a poll handle: id, run, dag, task, queue, handle."""
    if not ids:
        return []
    rows = conn.execute(
        sa.select(ti.c.id, ti.c.run_id, ti.c.dag_id, ti.c.task_id, ti.c.queue, ti.c.poll_handle).where(
            ti.c.id.in_(ids), ti.c.poll_handle.is_not(None)
        )
    )
    return [dict(r._mapping) for r in rows]


def request(
    conn: Connection,
    *,
    task_instance_id: int,
    run_id: str,
    dag_id: str,
    task_id: str,
    dag_version_id: int,
    queue: str,
    handle: Any,
    reason: str,
    now: datetime,
) -> None:
    """Record that the job `handle` must be cancelled by a worker serving `queue`."""
    conn.execute(
        sa.insert(jc).values(
            task_instance_id=task_instance_id,
            run_id=run_id,
            dag_id=dag_id,
            task_id=task_id,
            dag_version_id=dag_version_id,
            queue=queue,
            handle=handle,
            reason=reason[:250],
            requested_at=now,
            tries=0,
            next_try_at=now,
        )
    )


def claim(
    conn: Connection, *, worker_id: str, queues: list[str], now: datetime, lease_s: float, limit: int
) -> list[JobCancellation]:
    """Take up to `limit` owed cancels of these queues that are due and nobody holds (or whose
    holder's lease lapsed), for `lease_s` seconds."""
    stmt = (
        sa.select(*_COLUMNS)
        .where(
            jc.c.done_at.is_(None),
            jc.c.queue.in_(queues),
            jc.c.next_try_at <= now,
            jc.c.lease_expires_at.is_(None) | (jc.c.lease_expires_at < now),
        )
        .order_by(jc.c.id)
        .limit(limit)
    )
    rows = [JobCancellation(**r._mapping) for r in conn.execute(dialects.lock_for_claim(stmt, conn))]
    if rows:
        conn.execute(
            sa.update(jc)
            .where(jc.c.id.in_([r.id for r in rows]))
            .values(
                worker_id=worker_id, lease_expires_at=now + timedelta(seconds=lease_s), tries=jc.c.tries + 1
            )
        )
    return rows


def finish(
    conn: Connection, *, cancellation_id: int, worker_id: str, now: datetime, error: str | None
) -> bool:
    """The cancel ran (or was given up with `error`): done. False if another worker took it."""
    result = conn.execute(
        sa.update(jc)
        .where(jc.c.id == cancellation_id, jc.c.worker_id == worker_id, jc.c.done_at.is_(None))
        .values(done_at=now, error=error, lease_expires_at=None)
    )
    return bool(result.rowcount)


def retry_later(
    conn: Connection, *, cancellation_id: int, worker_id: str, now: datetime, delay_s: float, error: str
) -> bool:
    """The cancel failed: try again after `delay_s`, keeping the error."""
    result = conn.execute(
        sa.update(jc)
        .where(jc.c.id == cancellation_id, jc.c.worker_id == worker_id, jc.c.done_at.is_(None))
        .values(
            next_try_at=now + timedelta(seconds=delay_s), error=error, lease_expires_at=None, worker_id=None
        )
    )
    return bool(result.rowcount)


def list_for_run(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    """Every owed or done job cancel of a run, oldest first."""
    rows = conn.execute(sa.select(jc).where(jc.c.run_id == run_id).order_by(jc.c.id))
    return [dict(r._mapping) for r in rows]
