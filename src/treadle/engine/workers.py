"""Recording workers and their heartbeats (for listings and `why is it not running`)."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from treadle.domain.task_records import WorkerInfo
from treadle.store import workers as worker_store
from treadle.store.database import Database, db_now


def record_worker(
    db: Database,
    *,
    worker_id: str,
    hostname: str,
    pid: int,
    queues: list[str],
    concurrency: int,
    prefetch: int = 0,
    state: str = "running",
) -> None:
    """Register a worker (`starting` while it cannot claim yet)."""

    def work(conn: Connection) -> None:
        now = db_now(conn)
        worker_store.register_worker(
            conn,
            WorkerInfo(
                worker_id=worker_id,
                hostname=hostname,
                pid=pid,
                queues=tuple(queues),
                concurrency=concurrency,
                state=state,
                started_at=now,
                last_heartbeat_at=now,
                prefetch=prefetch,
            ),
        )

    db.transact(work)


def touch_worker(db: Database, worker_id: str, *, state: str, active: int = 0, prefetched: int = 0) -> None:
    """Record a worker heartbeat (or its stop) with its load."""
    db.transact(
        lambda conn: worker_store.touch_worker(
            conn, worker_id, now=db_now(conn), state=state, active=active, prefetched=prefetched
        )
    )


def list_workers(db: Database) -> list[WorkerInfo]:
    """Return every known worker."""
    return db.query(worker_store.list_workers)
