"""Deadlines the scheduler enforces: expired leases (attempt lost) and due retries."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy.engine import Connection

from treadle.domain.records import RunInfo
from treadle.domain.states import AttemptOutcome
from treadle.domain.task_records import AttemptError, AttemptRow
from treadle.engine.diagnosis import queued_blocker
from treadle.engine.execution import attempt_of, fail_attempt
from treadle.store import dialects
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

log = logging.getLogger("treadle.reaper")


def promote_due_retries(db: Database) -> int:
    """Queue every task instance whose retry wait, or wait for its next poke, is over; returns how many."""

    def work(conn: Connection) -> int:
        moved = ti_store.promote_due_retries(conn, now=db_now(conn))
        if moved:
            dialects.notify_ready(conn)
        return moved

    return db.transact(work)


def reap_expired_leases(db: Database, *, limit: int = 200, evidence_within_s: float | None = None) -> int:
    """Record `lost` for every running attempt whose lease expired, then apply its retry policy.

    The evidence (lease expiry vs database time) is read first and re-checked in the guarded
    update, so an attempt whose worker renewed in between is left alone. Loss or timeout is
    judged from the last heartbeat: a deadline that passed while the worker still heartbeated
    was overrun (`timed_out`, spends a retry); otherwise the worker died first (`lost`, which
    does not spend the budget but counts towards poison).

    Evidence that took longer than `evidence_within_s` to read is not used: the database
    stalled or went away meanwhile (its retries spanned an outage), so the time it read is
    from after a gap in which no worker could renew; nothing is reaped (the caller holds
    deadlines for a lease, then reads again).
    """

    def evidence(conn: Connection) -> tuple[datetime, list[AttemptRow], dict[str, RunInfo]]:
        now = db_now(conn)
        rows = ti_store.expired_leases(conn, now=now, limit=limit)
        runs = run_store.runs_for_versions(conn, sorted({r.run_id for r in rows}))
        return now, rows, runs

    began = time.monotonic()
    now, rows, runs = db.query(evidence)
    if evidence_within_s is not None and time.monotonic() - began > evidence_within_s:
        log.warning(
            "lease evidence read across a database stall; not reaping on it",
            extra={"event": "reaper.evidence_stale", "expired": len(rows)},
        )
        return 0
    reaped = 0
    for r in rows:
        task = attempt_of(r, runs[r.run_id], started_at=r.started_at)
        message = (
            f"lease expired at {_at(r.lease_expires_at)} (database time "
            f"{now.isoformat()}); worker {r.worker_id} on {r.hostname} stopped heartbeating"
            + (f" after {r.heartbeat_at.isoformat()}" if r.heartbeat_at else "")
        )
        timed_out = overran(timeout_at=r.timeout_at, heartbeat_at=r.heartbeat_at)
        ending = fail_attempt(
            db,
            task,
            skip_locked=True,
            outcome=AttemptOutcome.TIMED_OUT if timed_out else AttemptOutcome.LOST,
            error=AttemptError(
                error_type="TaskTimeout" if timed_out else "LeaseExpired",
                message=(f"execution deadline {_at(r.timeout_at)} passed; " if timed_out else "") + message,
                frame="treadle.reaper",
            ),
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
                    "lease_expires_at": _at(r.lease_expires_at),
                },
            )
    return reaped


def _at(value: datetime | None) -> str:
    """A time for a message (the queries that select a row guarantee the column is set)."""
    return value.isoformat() if value is not None else "unknown"


def overran(*, timeout_at: datetime | None, heartbeat_at: datetime | None) -> bool:
    """True if an attempt's execution deadline passed while its worker still heartbeated."""
    return timeout_at is not None and heartbeat_at is not None and timeout_at <= heartbeat_at


def expire_dispatch_deadlines(db: Database, *, worker_stale_s: float, limit: int = 200) -> int:
    """End `dispatch_timeout` the attempts that stayed queued past their deadline, with the reason.

    The reason is the first condition that held them (no live worker for the queue, a full or
    missing pool, a DAG limit), read with the evidence; then the retry policy applies.
    """

    def evidence(conn: Connection) -> tuple[datetime, list[AttemptRow], dict[str, RunInfo], list[str]]:
        now = db_now(conn)
        rows = ti_store.expired_dispatch(conn, now=now, limit=limit)
        runs = run_store.runs_for_versions(conn, sorted({r.run_id for r in rows}))
        reasons = [
            queued_blocker(
                conn,
                queue=r.queue,
                pool=r.pool,
                pool_slots=r.pool_slots,
                dag_id=r.dag_id,
                now=now,
                stale_s=worker_stale_s,
            )[0]
            for r in rows
        ]
        return now, rows, runs, reasons

    now, rows, runs, reasons = db.query(evidence)
    expired = 0
    for r, reason in zip(rows, reasons, strict=True):
        task = replace(attempt_of(r, runs[r.run_id], started_at=r.queued_at or now), attempt=r.attempt + 1)
        waited = (now - r.queued_at).total_seconds() if r.queued_at else 0.0
        error = AttemptError(
            error_type="DispatchTimeout",
            message=f"queued for {waited:.0f} s past its dispatch deadline: {reason}",
            frame="treadle.reaper",
        )
        ending = fail_attempt(
            db,
            task,
            skip_locked=True,
            outcome=AttemptOutcome.DISPATCH_TIMEOUT,
            error=error,
            worker_id=None,
            hostname=None,
            timeout_before=now,
        )
        if ending.applied:
            expired += 1
            log.warning(
                "dispatch deadline passed",
                extra={"event": "task_instance.dispatch_timeout", "task_instance_id": r.id, "reason": reason},
            )
    return expired


def enforce_execution_deadlines(db: Database, *, grace_s: float, limit: int = 200) -> int:
    """End `timed_out` running attempts whose deadline passed `grace_s` ago and nobody enforced it.

    A live worker kills its attempt at the deadline itself; this catches a worker that cannot
    (stuck, or its clock or process wedged). Its late report is then discarded by the fence.
    """

    def evidence(conn: Connection) -> tuple[datetime, list[AttemptRow], dict[str, RunInfo]]:
        now = db_now(conn)
        rows = ti_store.overdue_running(conn, before=now - timedelta(seconds=grace_s), limit=limit)
        runs = run_store.runs_for_versions(conn, sorted({r.run_id for r in rows}))
        return now, rows, runs

    now, rows, runs = db.query(evidence)
    enforced = 0
    for r in rows:
        task = attempt_of(r, runs[r.run_id], started_at=r.started_at or now)
        error = AttemptError(
            error_type="TaskTimeout",
            message=f"execution deadline {_at(r.timeout_at)} passed and worker {r.worker_id} "
            "did not end the attempt; ended by the reaper",
            frame="treadle.reaper",
        )
        ending = fail_attempt(
            db,
            task,
            skip_locked=True,
            outcome=AttemptOutcome.TIMED_OUT,
            error=error,
            worker_id=None,
            hostname=r.hostname,
            timeout_before=now - timedelta(seconds=grace_s),
            lost_by=r.worker_id,
        )
        enforced += ending.applied
    return enforced
