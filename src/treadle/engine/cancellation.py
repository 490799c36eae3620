"""Cancelling a run or one task: recorded with who asked; running attempts are killed.

A cancelled task ends like a failure for its downstream: each waiting task's trigger rule decides
(an `all_success` task becomes upstream_failed, an `all_done` clean-up still runs).

A running attempt's worker learns of the cancel when its lease renewal no longer matches
(at once where NOTIFY reaches it, at the next heartbeat otherwise), kills the attempt's
process group and reports nothing; a late report would be discarded by the fence anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion
from treadle.domain.lineage import LineageEventType
from treadle.domain.states import TERMINAL_RUN_STATES, AttemptOutcome, TaskState
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.domain.trigger_rules import End
from treadle.engine import lineage, propagation
from treadle.engine.execution import insert_attempt_record
from treadle.engine.propagation import Arrival
from treadle.engine.runs import cancel_run_row, close_run_if_done
from treadle.engine.sensing import owe_job_cancels
from treadle.engine.versions import version_of
from treadle.errors import InvalidRequest, RunNotFound
from treadle.store import audit, dialects
from treadle.store import cancellation as cancel_store
from treadle.store import runs as run_store
from treadle.store.database import Database, db_now

#: The states a trigger rule ends a waiting task in.
_RULED_OUT = frozenset({TaskState.UPSTREAM_FAILED.value, TaskState.SKIPPED.value})


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancellation:
    """What a cancel changed."""

    run_id: str
    cancelled: tuple[str, ...]
    running_killed: tuple[str, ...]
    run_state: str
    #: Downstream tasks a task's cancel ended through their trigger rules.
    ruled_out: tuple[str, ...] = ()


def cancel_run(db: Database, run_id: str, *, actor: str, reason: str = "") -> Cancellation:
    """Cancel every active task instance of a run and the run itself."""
    return db.transact(lambda conn: _cancel(db, conn, run_id, None, actor=actor, reason=reason))


def cancel_task(db: Database, run_id: str, task_id: str, *, actor: str, reason: str = "") -> Cancellation:
    """Cancel a task's active instances (each mapped one, if it is mapped); its downstream hear
    of a failed end and their trigger rules decide. The ones the rules end are listed too."""
    return db.transact(lambda conn: _cancel(db, conn, run_id, task_id, actor=actor, reason=reason))


def _cancel(
    db: Database, conn: Connection, run_id: str, task_id: str | None, *, actor: str, reason: str
) -> Cancellation:
    run = run_store.get_run(conn, run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id!r}")
    if run.state in TERMINAL_RUN_STATES and task_id is None:
        raise InvalidRequest(f"run {run_id!r} already ended {run.state}")
    version = version_of(db, conn, run.dag_version_id)
    targets: list[str] | None = None
    if task_id is not None:
        if task_id not in version.structure.tasks:
            raise InvalidRequest(f"run {run_id!r} has no task {task_id!r}")
        targets = [task_id]
    rows = cancel_store.active_instances(conn, run_id=run_id, task_ids=targets)
    if task_id is not None and not any(r.task_id == task_id for r in rows):
        raise InvalidRequest(f"task {task_id!r} of run {run_id!r} has already finished")
    now = db_now(conn)
    cancel_store.cancel_instances(conn, ids=[r.id for r in rows], now=now)
    if task_id is None:
        # Closing the run to cancelled follows the run protocol: under the run-row lock no
        # reopener can commit, so instances a reopener made active before it are seen here.
        run_store.lock_run_state(conn, run_id)
        late = cancel_store.active_instances(conn, run_id=run_id, task_ids=None)
        cancel_store.cancel_instances(conn, ids=[r.id for r in late], now=now)
        rows = [*rows, *late]
    note = f"cancelled by {actor}" + (f": {reason}" if reason else "")
    # A submitted external job is cancelled by a worker, which may run the task's code.
    owed = owe_job_cancels(
        db,
        conn,
        run_id=run_id,
        dag_version_id=run.dag_version_id,
        ids=[r.id for r in rows],
        reason=note,
        now=now,
    )
    running = [r for r in rows if r.state == TaskState.RUNNING.value]
    for r in running:
        task = ClaimedTask(
            task_instance_id=r.id,
            run_id=run_id,
            dag_id=run.dag_id,
            task_id=r.task_id,
            attempt=r.attempt,
            budget_base=0,
            orphaned_count=0,
            dag_version_id=run.dag_version_id,
            logical_date=run.logical_date,
            started_at=r.started_at,
            timeout_s=None,
            map_index=r.map_index,
        )
        if r.started_at is not None:
            lineage.attempts_ended(db, conn, [(task, now)], LineageEventType.ABORT)
        insert_attempt_record(
            conn,
            task,
            outcome=AttemptOutcome.CANCELLED,
            now=now,
            worker_id=r.worker_id or "",
            hostname=r.hostname or "",
            error=AttemptError(error_type="Cancelled", message=note, frame="treadle.cancel"),
        )
    ruled_out: list[str] = []
    if task_id is None:
        cancel_run_row(db, conn, run_id, now=now)
    else:
        ruled_out = _propagate(db, conn, version, run_id, task_id, ends=len(rows), now=now)
        close_run_if_done(db, conn, run_id)
    audit.record(
        conn,
        at=now,
        actor=actor,
        action="run.cancelled" if task_id is None else "task.cancelled",
        target=f"run:{run_id}" + (f"/task:{task_id}" if task_id else ""),
        details={"reason": reason, "cancelled": [r.task_id for r in rows], "ruled_out": ruled_out},
    )
    if running or owed:
        dialects.notify_cancel(conn)
    state = run_store.get_run(conn, run_id)
    return Cancellation(
        run_id=run_id,
        cancelled=tuple(r.task_id for r in rows),
        running_killed=tuple(r.task_id for r in running),
        run_state=state.state if state else run.state,
        ruled_out=tuple(ruled_out),
    )


def _propagate(
    db: Database,
    conn: Connection,
    version: DagVersion,
    run_id: str,
    task_id: str,
    *,
    ends: int,
    now: datetime,
) -> list[str]:
    """Send one failed end per cancelled instance to the task's downstream and let their rules
    decide; returns the downstream tasks that ended because of it (upstream_failed or skipped)."""
    downstream = sorted(version.all_downstream(task_id))
    before = cancel_store.task_states(conn, run_id=run_id, task_ids=downstream)
    follow = [Arrival(version.id, run_id, d, End.FAILED, n=ends) for d in version.downstream[task_id]]
    if propagation.deliver(db, conn, follow, now=now).queues:
        dialects.notify_ready(conn)
    ended = cancel_store.task_states(conn, run_id=run_id, task_ids=downstream) - before
    return sorted({t for t, state in ended if state in _RULED_OUT})
