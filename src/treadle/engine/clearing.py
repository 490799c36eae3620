"""Clearing task instances: finished tasks of a run go back to run again, with a fresh retry budget.

A cleared task goes back to pending and its trigger rule is applied to its upstreams as they
stand (queued at once when it is met); waiting rows after it have their counters recomputed; with
`downstream` its transitive downstream is reset too. A mapped task's instances are cleared one by
one, or, when an upstream is cleared too, folded back into one row that expands again. Attempt history
is kept (the attempt number carries on and becomes the budget base). Active instances are
never cleared. A finished run reopens. Everything happens in one transaction, with an audit entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from treadle.domain.clearing import plan_clear
from treadle.engine.mapping import release_held_back
from treadle.engine.propagation import branch_choices, settle
from treadle.engine.runs import reopen_run
from treadle.engine.versions import version_of
from treadle.errors import ClearConflict, RunNotFound
from treadle.store import audit, dialects
from treadle.store import clearing as clear_store
from treadle.store import mapping as mapping_store
from treadle.store import runs as run_store
from treadle.store.database import Database, db_now


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearReport:
    """What a clear did."""

    run_id: str
    #: Task ids put back to queued or pending, in dependency order.
    cleared: list[str]


def clear_tasks(
    db: Database,
    run_id: str,
    task_ids: Sequence[str] | None,
    *,
    downstream: bool,
    actor: str,
    reason: str,
    only_failed: bool = False,
) -> ClearReport:
    """Clear task instances of a run in one transaction (see `clear_in_transaction`)."""

    def work(conn: Connection) -> ClearReport:
        cleared = clear_in_transaction(
            db,
            conn,
            run_id,
            task_ids=task_ids,
            downstream=downstream,
            only_failed=only_failed,
            actor=actor,
            reason=reason,
        )
        return ClearReport(run_id=run_id, cleared=cleared)

    return db.transact(work)


def clear_in_transaction(
    db: Database,
    conn: Connection,
    run_id: str,
    *,
    task_ids: Sequence[str] | None,
    downstream: bool,
    only_failed: bool,
    actor: str,
    reason: str,
) -> list[str]:
    """Clear task instances of a run inside the caller's transaction; returns the cleared task ids.

    `task_ids` None names every task of the run. `only_failed` keeps only the named instances
    that did not end success or skipped. `downstream` adds every task downstream of those.
    Raises InvalidRequest (before changing anything) for an unknown task, an instance that is
    still active, or a task that could never run because an upstream left out of the clear
    failed; ClearConflict if an instance moved meanwhile.
    """
    found = run_store.get_run(conn, run_id)
    if found is None:
        raise RunNotFound(f"no run {run_id!r}")
    version = version_of(db, conn, found.dag_version_id)
    # Instances first, then (in reopen_run) the run, in the order every party locks them.
    instances = clear_store.lock_instances(conn, run_id)
    plan = plan_clear(
        version,
        run_id,
        instances,
        task_ids=task_ids,
        downstream=downstream,
        only_failed=only_failed,
        branch_choices=branch_choices(conn, version, run_id, instances),
    )
    if not plan.order:
        return []
    now = db_now(conn)
    moved = clear_store.reset_instances(conn, plan.resets, now=now)
    moved += mapping_store.retire(conn, plan.retires, now=now)
    if moved != len(plan.resets) + len(plan.retires):
        raise ClearConflict(run_id=run_id)
    # Cleared rows and the rows waiting right after them: counters recounted, rules applied.
    readied = settle(db, conn, version, run_id, plan.order, now=now)
    for task_id in plan.order:
        limit = version.structure.tasks[task_id].max_active_mapped
        if limit is not None:
            readied.add(
                run_id, release_held_back(conn, run_id=run_id, task_id=task_id, max_active=limit, now=now)
            )
    reopen_run(conn, run_id, now=now)
    audit.record(
        conn,
        at=now,
        actor=actor,
        action="task.clear",
        target=f"run:{run_id}",
        details={
            "reason": reason,
            "tasks": plan.order,
            "requested": sorted(set(task_ids)) if task_ids is not None else None,
            "downstream": downstream,
            "only_failed": only_failed,
        },
    )
    if plan.queues_any or readied.queues:
        dialects.notify_ready(conn)
    return plan.order
