"""Worker registry: who is serving which queues, and when each last reported."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.task_records import WorkerInfo
from treadle.store.tables import workers


def register_worker(conn: Connection, info: WorkerInfo) -> None:
    """Insert or replace a worker's row."""
    conn.execute(sa.delete(workers).where(workers.c.worker_id == info.worker_id))
    conn.execute(
        sa.insert(workers).values(
            worker_id=info.worker_id,
            hostname=info.hostname,
            pid=info.pid,
            queues=list(info.queues),
            concurrency=info.concurrency,
            state=info.state,
            started_at=info.started_at,
            last_heartbeat_at=info.last_heartbeat_at,
            prefetch=info.prefetch,
        )
    )


def touch_worker(
    conn: Connection, worker_id: str, *, now: datetime, state: str, active: int = 0, prefetched: int = 0
) -> None:
    """Record a worker's heartbeat, state and load."""
    conn.execute(
        sa.update(workers)
        .where(workers.c.worker_id == worker_id)
        .values(last_heartbeat_at=now, state=state, active=active, prefetched=prefetched)
    )


def list_workers(conn: Connection) -> list[WorkerInfo]:
    """Return every known worker, newest heartbeat first."""
    rows = conn.execute(sa.select(workers).order_by(workers.c.last_heartbeat_at.desc()))
    return [WorkerInfo(**{**r._mapping, "queues": tuple(r.queues)}) for r in rows]
