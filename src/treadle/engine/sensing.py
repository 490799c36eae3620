"""Sensors and submit-then-poll tasks: start a poke, reschedule it, time it out, owe job cancels.

Each poke is a short attempt. One that finds the condition unmet (or the submitted job still
running) ends `rescheduled`: the instance waits in `up_for_reschedule` until `next_attempt_at`,
holding no slot, and the promotion pass of the reaper queues it again like a due retry. Pokes
spend no retry (the budget's base moves on with each) and are not lost attempts, so they never
count towards poison. The timeout counts from the first poke; a poke that starts past it is the
last: still unmet, the instance is dead-lettered `sensor_timeout` (skipped if `soft_fail`, and
its pending downstream with it). Every write is fenced by worker id and attempt, as a failure is.

Cancelling a submitted job runs user code, which the scheduler and the CLI never import: a
cancellation records the job's handle in `job_cancellations`, and a worker serving the task's
queue runs `cancel(handle)` (`worker/job_cancels.py`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion
from treadle.domain.lineage import LineageEventType
from treadle.domain.outbox import OutboxKind
from treadle.domain.sensing import PokeKind, is_final_poke, poke_deadline
from treadle.domain.states import AttemptOutcome, DeadLetterReason, TaskState
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.domain.transitions import UseCase
from treadle.domain.trigger_rules import End
from treadle.engine import lineage, outbox, propagation
from treadle.engine.execution import (
    MAX_MESSAGE_CHARS,
    Ending,
    Reschedule,
    discard_late_report,
    insert_attempt_record,
    reschedule_in,
    spec_of,
)
from treadle.engine.runs import close_run_if_done
from treadle.engine.versions import version_of
from treadle.store import dialects
from treadle.store import job_cancellations as job_store
from treadle.store import pokes as poke_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now
from treadle.store.job_cancellations import JobCancellation

log = logging.getLogger("treadle.engine")

#: Why a job is owed a cancel when the attempt that submitted it was lost before its handle was
#: recorded.
ORPHANED_JOB = "submitted by an attempt that was cancelled or lost before its handle was recorded"


@dataclass(frozen=True, slots=True, kw_only=True)
class PokeStart:
    """What a poke starts from: the state the last one left and whether it is the final one."""

    #: A submitted job's handle or a sensor's state (None on the first poke). Any: JSON.
    state: Any
    final: bool
    first_poke_at: datetime | None


def poke_start(db: Database, task: ClaimedTask, version: DagVersion | None = None) -> PokeStart:
    """What the poke of a claimed attempt starts from, on the database's clock.

    An attempt a claim just read carries the poke columns and the claim's time (`claimed_at`):
    no query then (`version`, if given, saves the version lookup too). The clock it judges
    "final" by is its start, or else its claim: never later than the poke really starts, so a
    poke is never told it is the last one early (one that runs a little past the timeout without
    knowing is rescheduled to the deadline, and the next poke is the final one).
    """
    if task.claimed_at is not None:
        version = version or db.query(lambda conn: version_of(db, conn, task.dag_version_id))
        spec = spec_of(version, task.task_id)
        clock = task.started_at or task.claimed_at
        return PokeStart(
            state=task.poll_state,
            final=is_final_poke(spec, first_poke_at=task.first_poke_at, now=clock),
            first_poke_at=task.first_poke_at,
        )

    def work(conn: Connection) -> PokeStart:
        spec = spec_of(version_of(db, conn, task.dag_version_id), task.task_id)
        row = poke_store.poke_row(conn, task.task_instance_id)
        first = row.first_poke_at if row is not None else None
        return PokeStart(
            state=row.poll_handle if row is not None else None,
            final=is_final_poke(spec, first_poke_at=first, now=db_now(conn)),
            first_poke_at=first,
        )

    return db.transact(work)


def reschedule_attempt(
    db: Database,
    task: ClaimedTask,
    *,
    worker_id: str,
    hostname: str,
    state: Any,
    evidence: dict[str, Any] | None = None,
    code_version: str | None = None,
    first_poke_at: datetime | None = None,
) -> Ending:
    """Record, in a transaction of its own, a poke that found the condition unmet (or the job
    running) and schedule the next (see `execution.Reschedule`; a worker's dispatch pass records
    its slots' reschedules together, `execution.work_cycle`).
    `first_poke_at`: as `poke_start` read it (None on the first poke: this one's start).
    """
    poke = Reschedule(
        task=task, state=state, evidence=evidence, code_version=code_version, first_poke_at=first_poke_at
    )
    return db.transact(lambda conn: reschedule_in(db, conn, poke, worker_id=worker_id, hostname=hostname))


def time_out_sensor(
    db: Database,
    task: ClaimedTask,
    *,
    worker_id: str,
    hostname: str,
    evidence: dict[str, Any] | None = None,
    code_version: str | None = None,
) -> Ending:
    """The final poke found the condition still unmet: dead-letter `sensor_timeout`, or with
    `soft_fail` skip the instance; the end reaches its downstream through their trigger rules.
    Fenced by worker id and attempt."""

    def work(conn: Connection) -> Ending:
        now = db_now(conn)
        version = version_of(db, conn, task.dag_version_id)
        spec = spec_of(version, task.task_id)
        row = poke_store.poke_row(conn, task.task_instance_id)
        first = row.first_poke_at if row is not None else None
        target = TaskState.SKIPPED if spec.soft_fail else TaskState.DEAD_LETTER
        if not ti_store.end_running(
            conn,
            task_instance_id=task.task_instance_id,
            attempt=task.attempt,
            new_state=target,
            by=UseCase.SENSOR_TIMEOUT,
            now=now,
            worker_id=worker_id,
            dead_letter_reason=None if spec.soft_fail else DeadLetterReason.SENSOR_TIMEOUT.value,
        ):
            discard_late_report(conn, task, "sensor timeout")
            return Ending(applied=False)
        what = (
            "the submitted job did not finish"
            if spec.kind is PokeKind.DEFERRED
            else "the condition did not hold"
        )
        deadline = poke_deadline(spec, first)
        message = (
            f"{what} within the sensor timeout of {spec.timeout_s} s"
            + (
                f" (first poke {first.isoformat()}, deadline {deadline.isoformat()})"
                if first and deadline
                else ""
            )
            + ("; skipped (soft_fail)" if spec.soft_fail else "")
        )
        error = AttemptError(
            error_type="SensorTimeout",
            message=message[:MAX_MESSAGE_CHARS],
            frame="treadle.sensor",
            retryable=False,
            code_version=code_version,
            outputs=evidence or None,
        )
        insert_attempt_record(
            conn,
            task,
            outcome=AttemptOutcome.TIMED_OUT,
            now=now,
            worker_id=worker_id,
            hostname=hostname,
            error=error,
        )
        lineage.attempts_ended(db, conn, [(task, now)], LineageEventType.FAIL)
        # The end travels on through the trigger rules of what follows, as any task's end does.
        if spec.soft_fail:
            arrivals = [
                propagation.Arrival(version.id, task.run_id, d, End.SKIPPED)
                for d in version.downstream[task.task_id]
            ]
            if propagation.deliver(db, conn, arrivals, now=now).queues:
                dialects.notify_ready(conn)
        else:
            reason = DeadLetterReason.SENSOR_TIMEOUT.value
            alert = outbox.dead_letter_payload(task, error, reason=reason, at=now)
            outbox.enqueue(db, conn, kind=OutboxKind.TASK_DEAD_LETTER, payloads=[alert])
            propagation.after_dead_letter(db, conn, task, now=now)
        close_run_if_done(db, conn, task.run_id)
        return Ending(applied=True)

    return db.transact(work)


def forget_job(db: Database, task: ClaimedTask) -> None:
    """The submitted job of this instance ended (failed): its next attempt submits anew."""
    db.transact(lambda conn: poke_store.forget_poll_state(conn, task_instance_id=task.task_instance_id))


def owe_job_cancel(db: Database, task: ClaimedTask, *, handle: Any, queue: str, reason: str) -> None:
    """Record that a job submitted by an attempt this worker could not record must be cancelled
    (the attempt was cancelled or lost while it submitted)."""

    def work(conn: Connection) -> None:
        job_store.request(
            conn,
            task_instance_id=task.task_instance_id,
            run_id=task.run_id,
            dag_id=task.dag_id,
            task_id=task.task_id,
            dag_version_id=task.dag_version_id,
            queue=queue,
            handle=handle,
            reason=reason,
            now=db_now(conn),
        )
        dialects.notify_cancel(conn)

    db.transact(work)


def owe_job_cancels(
    db: Database,
    conn: Connection,
    *,
    run_id: str,
    dag_version_id: int,
    ids: list[int],
    reason: str,
    now: datetime,
) -> int:
    """In a cancel's transaction: owe a job cancel for each of `ids` that holds a submitted job's
    handle (submit-then-poll tasks only; a sensor's state is no job). Returns how many."""
    version = version_of(db, conn, dag_version_id)
    owed = 0
    for row in job_store.handles_of(conn, ids):
        spec = version.structure.tasks[row["task_id"]].sensor
        if spec is None or spec.kind is not PokeKind.DEFERRED:
            continue
        job_store.request(
            conn,
            task_instance_id=row["id"],
            run_id=run_id,
            dag_id=row["dag_id"],
            task_id=row["task_id"],
            dag_version_id=dag_version_id,
            queue=row["queue"],
            handle=row["poll_handle"],
            reason=reason,
            now=now,
        )
        owed += 1
    return owed


#: Tries of a job cancel before it is given up (recorded with its error).
MAX_CANCEL_TRIES = 10


def claim_job_cancels(
    db: Database, *, worker_id: str, queues: list[str], lease_s: float, limit: int = 4
) -> list[JobCancellation]:
    """Take owed job cancels of these queues for this worker (each for `lease_s` seconds)."""
    return db.transact(
        lambda conn: job_store.claim(
            conn, worker_id=worker_id, queues=queues, now=db_now(conn), lease_s=lease_s, limit=limit
        )
    )


def finish_job_cancel(db: Database, job: JobCancellation, *, worker_id: str, error: str | None) -> bool:
    """Record how a job cancel went: done, or (failed, tries left) due again after a backoff."""

    def work(conn: Connection) -> bool:
        now = db_now(conn)
        if error is not None and job.tries < MAX_CANCEL_TRIES:
            return job_store.retry_later(
                conn,
                cancellation_id=job.id,
                worker_id=worker_id,
                now=now,
                delay_s=min(2.0**job.tries, 300.0),
                error=error[:MAX_MESSAGE_CHARS],
            )
        return job_store.finish(
            conn,
            cancellation_id=job.id,
            worker_id=worker_id,
            now=now,
            error=None if error is None else error[:MAX_MESSAGE_CHARS],
        )

    return db.transact(work)


def dataset_event_for_interval(
    db: Database, dataset: str, *, start: datetime, end: datetime
) -> dict[str, Any] | None:
    """The newest event on `dataset` from a run whose data interval covers [start, end) (the
    dataset sensor's question); None if there is none yet."""
    return db.query(lambda conn: poke_store.dataset_event_covering(conn, dataset, start=start, end=end))
