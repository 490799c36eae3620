"""The database's side of the metrics: queue depth and age, the leader lease, worker heartbeats,
read at scrape time in one short read transaction (never per task)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store import leases
from treadle.store.database import db_now
from treadle.store.outbox import OutboxStats
from treadle.store.outbox import stats as outbox_stats
from treadle.store.queues import QueueStats, queue_stats
from treadle.store.tables import workers


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerBeat:
    """A worker that says it runs, and when it last said so."""

    worker_id: str
    last_heartbeat_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemGauges:
    """What the database says about the whole deployment at one moment (`now`, database time)."""

    now: datetime
    queues: list[QueueStats]
    leader: leases.LeaseInfo | None
    #: Workers in state running (a worker that stopped cleanly says so and is not here).
    running_workers: list[WorkerBeat]
    outbox: OutboxStats


def read_gauges(conn: Connection, *, lease_name: str) -> SystemGauges:
    """Queue stats (one grouped query over queued and running rows), the lease `lease_name`, the
    heartbeats of workers that claim to run, and the outbox's pending and dead counts."""
    rows = conn.execute(
        sa.select(workers.c.worker_id, workers.c.last_heartbeat_at).where(workers.c.state == "running")
    )
    return SystemGauges(
        now=db_now(conn),
        queues=queue_stats(conn),
        leader=leases.get(conn, lease_name),
        running_workers=[
            WorkerBeat(worker_id=r.worker_id, last_heartbeat_at=r.last_heartbeat_at) for r in rows
        ],
        outbox=outbox_stats(conn),
    )
