"""Claiming attempts and recording how they end, each fenced by worker id and attempt number."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.fingerprint import fingerprint
from treadle.domain.records import AttemptError, ClaimedTask
from treadle.domain.retry import RetryDecision, decide_retry
from treadle.domain.states import AttemptOutcome, TaskState
from treadle.engine.dags import version_of
from treadle.engine.runs import finish_run_if_done
from treadle.errors import ResultTooLarge
from treadle.store import attempts as attempt_store
from treadle.store import dialects
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

log = logging.getLogger("treadle.engine")

MAX_MESSAGE_CHARS = 4_000
MAX_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Ending:
    """How a worker's report was taken: applied, or discarded because the attempt was lost."""

    applied: bool
    decision: RetryDecision | None = None


def claim_task_instances(
    db: Database, *, worker_id: str, hostname: str, queues: list[str], limit: int, lease_s: float
) -> list[ClaimedTask]:
    """Claim up to `limit` queued task instances and gather what running them needs."""
    if limit <= 0:
        return []

    def work(conn: Connection) -> list[ClaimedTask]:
        now = db_now(conn)
        rows = ti_store.claim(
            conn,
            worker_id=worker_id,
            hostname=hostname,
            queues=queues,
            limit=limit,
            now=now,
            lease_s=lease_s,
        )
        if not rows:
            return []
        runs = run_store.runs_for_versions(conn, sorted({r.run_id for r in rows}))
        wanted: list[tuple[str, str]] = []
        for r in rows:
            structure = version_of(db, conn, runs[r.run_id].dag_version_id).structure
            wanted.extend((r.run_id, up) for up in structure.tasks[r.task_id].upstream)
        results = attempt_store.get_results(conn, wanted)
        claimed = []
        for r in rows:
            run = runs[r.run_id]
            ups = version_of(db, conn, run.dag_version_id).structure.tasks[r.task_id].upstream
            claimed.append(
                ClaimedTask(
                    task_instance_id=r.id,
                    run_id=r.run_id,
                    dag_id=r.dag_id,
                    task_id=r.task_id,
                    attempt=r.attempt,
                    budget_base=r.budget_base,
                    orphaned_count=r.orphaned_count,
                    dag_version_id=run.dag_version_id,
                    logical_date=run.logical_date,
                    started_at=now,
                    timeout_s=r.timeout_s,
                    conf=run.conf,
                    upstream_results={u: results.get((r.run_id, u)) for u in ups},
                )
            )
        return claimed

    return db.transact(work)


def check_result_size(value: Any, *, max_bytes: int) -> None:
    """Raise ResultTooLarge (or TypeError for non-JSON values) before anything is written."""
    size = len(json.dumps(value))
    if size > max_bytes:
        raise ResultTooLarge(f"result is {size} bytes; the limit is {max_bytes} bytes")


def complete_attempt(db: Database, task: ClaimedTask, *, worker_id: str, hostname: str, value: Any) -> Ending:
    """Record success, store the result and ready the downstream, all in one transaction."""

    def work(conn: Connection) -> Ending:
        now = db_now(conn)
        if not ti_store.end_running(
            conn,
            task_instance_id=task.task_instance_id,
            attempt=task.attempt,
            new_state=TaskState.SUCCESS,
            now=now,
            worker_id=worker_id,
        ):
            _discard(conn, task, "success")
            return Ending(applied=False)
        attempt_store.put_result(
            conn,
            task_instance_id=task.task_instance_id,
            run_id=task.run_id,
            task_id=task.task_id,
            value=value,
            now=now,
        )
        _insert_attempt(
            conn,
            task,
            outcome=AttemptOutcome.SUCCESS,
            now=now,
            worker_id=worker_id,
            hostname=hostname,
        )
        downstream = version_of(db, conn, task.dag_version_id).downstream[task.task_id]
        if downstream:
            if ti_store.count_upstream_success(conn, run_id=task.run_id, downstream=downstream, now=now):
                dialects.notify_ready(conn)
        else:
            finish_run_if_done(conn, task.run_id)
        return Ending(applied=True)

    return db.transact(work)


def fail_attempt(
    db: Database,
    task: ClaimedTask,
    *,
    outcome: AttemptOutcome,
    error: AttemptError,
    worker_id: str | None,
    hostname: str | None,
    lease_expired_before: datetime | None = None,
    lost_by: str | None = None,
) -> Ending:
    """Record an unsuccessful attempt and apply the retry policy (retry_wait or dead_letter).

    A worker passes its `worker_id` (fence); the reaper passes `lease_expired_before` instead,
    and `lost_by`, the worker that held the lease, for the attempt's record.
    """
    orphaned = outcome is AttemptOutcome.LOST
    rand = random.random()

    def work(conn: Connection) -> Ending:
        now = db_now(conn)
        version = version_of(db, conn, task.dag_version_id)
        decision = decide_retry(
            version.structure.tasks[task.task_id].retry,
            attempt_in_budget=task.attempt - task.budget_base,
            orphaned_count=task.orphaned_count + (1 if orphaned else 0),
            retryable=error.retryable,
            rand=rand,
        )
        if decision.retry:
            state, next_at = TaskState.RETRY_WAIT, now + timedelta(seconds=decision.delay_s)
        else:
            state, next_at = TaskState.DEAD_LETTER, None
        reason = decision.dead_letter_reason.value if decision.dead_letter_reason else None
        if not ti_store.end_running(
            conn,
            task_instance_id=task.task_instance_id,
            attempt=task.attempt,
            new_state=state,
            now=now,
            worker_id=worker_id,
            lease_expired_before=lease_expired_before,
            next_attempt_at=next_at,
            dead_letter_reason=reason,
            orphaned=orphaned,
        ):
            if worker_id is not None:
                _discard(conn, task, outcome.value)
            return Ending(applied=False)
        _insert_attempt(
            conn,
            task,
            outcome=outcome,
            now=now,
            worker_id=worker_id or lost_by or "",
            hostname=hostname or "",
            error=error,
            retry_delay_s=decision.delay_s if decision.retry else None,
        )
        if state is TaskState.DEAD_LETTER:
            ti_store.mark_upstream_failed(
                conn, run_id=task.run_id, now=now, task_ids=version.all_downstream(task.task_id)
            )
            finish_run_if_done(conn, task.run_id)
        return Ending(applied=True, decision=decision)

    return db.transact(work)


def extend_leases(
    db: Database, *, worker_id: str, held: list[tuple[int, int]], lease_s: float
) -> set[tuple[int, int]]:
    """Renew this worker's leases; returns the (task instance id, attempt) pairs it still holds."""

    def work(conn: Connection) -> set[tuple[int, int]]:
        return ti_store.extend_leases(conn, worker_id=worker_id, held=held, now=db_now(conn), lease_s=lease_s)

    return db.transact(work)


def _insert_attempt(
    conn: Connection,
    task: ClaimedTask,
    *,
    outcome: AttemptOutcome,
    now: datetime,
    worker_id: str,
    hostname: str,
    error: AttemptError | None = None,
    retry_delay_s: float | None = None,
) -> None:
    attempt_store.insert_attempt(
        conn,
        task_instance_id=task.task_instance_id,
        run_id=task.run_id,
        dag_id=task.dag_id,
        task_id=task.task_id,
        attempt=task.attempt,
        outcome=outcome.value,
        error_type=error.error_type[:250] if error else None,
        error_message=error.message[:MAX_MESSAGE_CHARS] if error else None,
        traceback=error.traceback[-MAX_TRACEBACK_CHARS:] if error else None,
        fingerprint=fingerprint(error.error_type, error.message, error.frame) if error else None,
        worker_id=worker_id or None,
        hostname=hostname or None,
        started_at=task.started_at,
        ended_at=now,
        duration_s=max((now - task.started_at).total_seconds(), 0.0),
        retry_delay_s=retry_delay_s,
    )


def _discard(conn: Connection, task: ClaimedTask, what: str) -> None:
    """A report for an attempt this worker no longer holds: record it, apply nothing (fencing)."""
    attempt_store.mark_late_result(
        conn,
        task_instance_id=task.task_instance_id,
        attempt=task.attempt,
        note=f"late {what} discarded",
    )
    log.warning(
        "late report discarded",
        extra={
            "event": "task_instance.late_report_discarded",
            "task_instance_id": task.task_instance_id,
            "attempt": task.attempt,
            "report": what,
        },
    )
