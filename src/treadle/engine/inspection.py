"""Task instances that need inspection (an unknown commit): list them, and resolve one.

An attempt that ends with an unknown commit (exit code 60 under the standard contract, or
`UnknownCommit` raised by a Python task) may have written part of its output. Retrying could
write it twice, and going on could publish half of it, so the instance waits in
`needs_inspection`: it holds its run open and blocks its downstream until an operator looks at
the output and resolves it, with a reason that the audit log keeps:

- success: the output is complete; the downstream proceeds (no result is passed on), and the
  task's outlets record their dataset events as a success would;
- failed: the output is unusable; the instance is dead-lettered (`resolved_failed`) and its
  downstream becomes upstream_failed, as for any dead letter;
- requeue: run the task again, with a fresh retry budget (the job must be able to start over).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion
from treadle.domain.outbox import OutboxKind
from treadle.domain.states import TaskState
from treadle.domain.task_records import AttemptInfo, TaskInstanceInfo
from treadle.domain.transitions import UseCase
from treadle.domain.trigger_rules import End
from treadle.engine import outbox, propagation
from treadle.engine.datasets import record_outlet_events
from treadle.engine.mapping import release_held_back
from treadle.engine.runs import close_run_if_done
from treadle.engine.versions import version_of
from treadle.errors import InvalidRequest, RunNotFound
from treadle.store import attempts as attempt_store
from treadle.store import audit, dialects
from treadle.store import mapping as mapping_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now


class Resolution(StrEnum):
    """How an operator resolves a task instance that needs inspection."""

    SUCCESS = "success"
    FAILED = "failed"
    REQUEUE = "requeue"


@dataclass(frozen=True, slots=True, kw_only=True)
class Inspection:
    """A task instance waiting for an operator, with the attempt that asked for it."""

    task_instance: TaskInstanceInfo
    last_attempt: AttemptInfo | None


def _follow(
    db: Database, conn: Connection, version: DagVersion, found: TaskInstanceInfo, end: End, *, now: datetime
) -> bool:
    """What the resolved end leads to, as for any task's end: its direct downstream count it under
    their trigger rules (plain ones by counter, as the hot path does), and a held-back sibling of
    a mapped instance may start. True if something was queued."""
    tasks = version.structure.tasks
    downstream = version.downstream[found.task_id]
    plain = [d for d in downstream if end is End.SUCCESS and propagation.is_plain(tasks[d])]
    follow: list[propagation.FollowUp] = [
        propagation.Arrival(version.id, found.run_id, d, end) for d in downstream if d not in plain
    ]
    follow.extend(propagation.releases_after(tasks[found.task_id], found.run_id, found.map_index))
    readied = (
        ti_store.count_upstream_successes(conn, increments={(found.run_id, d): 1 for d in plain}, now=now)
        if plain
        else set()
    )
    return bool(readied) | bool(propagation.deliver(db, conn, follow, now=now).queues)


def _requeue(conn: Connection, version: DagVersion, found: TaskInstanceInfo, *, now: datetime) -> bool:
    """needs_inspection -> queued with a fresh budget; a mapped instance under max_active_mapped
    is held back instead and goes when its siblings leave room. False if it moved meanwhile."""
    limit = version.structure.tasks[found.task_id].max_active_mapped if found.map_index >= 0 else None
    if limit is None:
        return ti_store.requeue_dead_letter(conn, task_instance_id=found.id, now=now, by=UseCase.RESOLVE)
    if not mapping_store.requeue_held_back(conn, task_instance_id=found.id, now=now, by=UseCase.RESOLVE):
        return False
    release_held_back(conn, run_id=found.run_id, task_id=found.task_id, max_active=limit, now=now)
    return True


def _record_outlets(
    db: Database,
    conn: Connection,
    version: DagVersion,
    mode: str,
    found: TaskInstanceInfo,
    *,
    actor: str,
    reason: str,
    now: datetime,
) -> None:
    """A task resolved as success records its outlets' dataset events, as a success would."""
    outlets = version.structure.tasks[found.task_id].outlets
    if mode == "shadow" or not outlets:
        return
    rows = [
        {
            "dataset": name,
            "run_id": found.run_id,
            "dag_id": found.dag_id,
            "task_id": found.task_id,
            "version": None,
            "extra": {"resolved_by": actor, "reason": reason.strip()[:500]},
            "created_at": now,
        }
        for name in outlets
    ]
    record_outlet_events(conn, rows)
    outbox.enqueue(db, conn, kind=OutboxKind.DATASET_PUBLISHED, payloads=outbox.dataset_payloads(rows))


def list_needs_inspection(db: Database, *, limit: int = 1000) -> list[Inspection]:
    """Task instances in needs_inspection, oldest first, each with its last attempt."""

    def work(conn: Connection) -> list[Inspection]:
        tis = ti_store.list_in_state(conn, TaskState.NEEDS_INSPECTION, limit=limit)
        last = attempt_store.last_attempts(conn, [t.id for t in tis])
        return [Inspection(task_instance=t, last_attempt=last.get(t.id)) for t in tis]

    return db.query(work)


def resolve(
    db: Database,
    run_id: str,
    task_id: str,
    *,
    resolution: Resolution,
    reason: str,
    actor: str,
    map_index: int = -1,
) -> TaskInstanceInfo:
    """Resolve a needs_inspection task instance (see the module docstring); audited.

    Refused, naming the problem, when the reason is empty, the instance does not exist or is not
    in needs_inspection. A resolution that makes work active again (success readying the
    downstream, requeue) reopens nothing: the run never closed while the instance waited.
    """
    if not reason.strip():
        raise InvalidRequest("a reason is required to resolve a task that needs inspection (--reason)")
    resolution = Resolution(resolution)

    def work(conn: Connection) -> TaskInstanceInfo:
        run = run_store.get_run(conn, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        found = ti_store.find_task_instance(conn, run_id=run_id, task_id=task_id, map_index=map_index)
        if found is None:
            raise InvalidRequest(f"run {run_id!r} has no task {task_id!r}")
        if found.state != TaskState.NEEDS_INSPECTION.value:
            raise InvalidRequest(
                f"task {task_id!r} of run {run_id!r} is {found.state}, not needs_inspection: "
                "nothing to resolve"
            )
        now = db_now(conn)
        version = version_of(db, conn, run.dag_version_id)
        if resolution is Resolution.REQUEUE:
            moved = _requeue(conn, version, found, now=now)
        else:
            target = TaskState.SUCCESS if resolution is Resolution.SUCCESS else TaskState.DEAD_LETTER
            moved = ti_store.resolve_inspection(
                conn, task_instance_id=found.id, attempt=found.attempt, new_state=target, now=now
            )
        if not moved:
            raise InvalidRequest(
                f"task {task_id!r} of run {run_id!r} changed while it was being resolved; nothing was applied"
            )
        if resolution is Resolution.REQUEUE:
            dialects.notify_ready(conn)
        elif resolution is Resolution.SUCCESS:
            readied = _follow(db, conn, version, found, End.SUCCESS, now=now)
            _record_outlets(db, conn, version, run.mode, found, actor=actor, reason=reason, now=now)
            if readied:
                dialects.notify_ready(conn)
            else:
                close_run_if_done(db, conn, run_id)
        else:
            if _follow(db, conn, version, found, End.FAILED, now=now):
                dialects.notify_ready(conn)
            close_run_if_done(db, conn, run_id)
        audit.record(
            conn,
            at=now,
            actor=actor,
            action="task.resolve",
            target=f"{run_id}/{task_id}" + (f"[{map_index}]" if map_index >= 0 else ""),
            details={"as": resolution.value, "reason": reason.strip(), "attempt": found.attempt},
        )
        updated = ti_store.get_task_instance(conn, found.id)
        assert updated is not None
        return updated

    return db.transact(work)
