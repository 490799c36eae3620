"""Deadlines the scheduler enforces: expired leases (attempt lost) and due retries."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.records import AttemptError
from treadle.domain.states import AttemptOutcome
from treadle.engine.execution import attempt_of, fail_attempt
from treadle.store import dialects
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

log = logging.getLogger("treadle.reaper")


def promote_due_retries(db: Database) -> int:
    """Queue every task instance whose retry wait is over; returns how many."""

    def work(conn: Connection) -> int:
        moved = ti_store.promote_due_retries(conn, now=db_now(conn))
        if moved:
            dialects.notify_ready(conn)
        return moved

    return db.transact(work)


def reap_expired_leases(db: Database, *, limit: int = 200) -> int:
    """Record `lost` for every running attempt whose lease expired, then apply its retry policy.

    The evidence (lease expiry vs database time) is read first and re-checked in the guarded
    update, so an attempt whose worker renewed in between is left alone.
    """

    def evidence(conn: Connection) -> tuple[Any, list[Any], dict[str, Any]]:
        now = db_now(conn)
        rows = ti_store.expired_leases(conn, now=now, limit=limit)
        runs = run_store.runs_for_versions(conn, sorted({r.run_id for r in rows}))
        return now, rows, runs

    now, rows, runs = db.query(evidence)
    reaped = 0
    for r in rows:
        task = attempt_of(r, runs[r.run_id], started_at=r.started_at or now)
        message = (
            f"lease expired at {r.lease_expires_at.isoformat()} (database time "
            f"{now.isoformat()}); worker {r.worker_id} on {r.hostname} stopped heartbeating"
        )
        ending = fail_attempt(
            db,
            task,
            outcome=AttemptOutcome.LOST,
            error=AttemptError(error_type="LeaseExpired", message=message, frame="treadle.reaper"),
            worker_id=None,
            hostname=r.hostname,
            lease_expired_before=now,
            lost_by=r.worker_id,
        )
        if ending.applied:
            reaped += 1
            log.warning(
                "attempt lost",
                extra={
                    "event": "task_instance.lost",
                    "task_instance_id": r.id,
                    "attempt": r.attempt,
                    "worker_id": r.worker_id,
                    "lease_expires_at": r.lease_expires_at.isoformat(),
                },
            )
    return reaped
