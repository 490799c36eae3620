"""Clearing task instances: finished tasks of a run go back to run again, with a fresh retry budget.

A cleared task is queued when every upstream has succeeded, else pending with its upstream
counter recomputed; with `downstream` its transitive downstream is reset too. Attempt history
is kept (the attempt number carries on and becomes the budget base). Active instances are
never cleared. A finished run reopens. Everything happens in one transaction, with an audit entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion
from treadle.domain.graph import topological_order
from treadle.domain.states import TaskState
from treadle.domain.transitions import UseCase, task_sources
from treadle.engine.dags import version_of
from treadle.engine.runs import reopen_run
from treadle.errors import ClearConflict, InvalidRequest, RunNotFound
from treadle.store import audit, dialects
from treadle.store import clearing as clear_store
from treadle.store import runs as run_store
from treadle.store.database import Database, db_now

#: States a task instance may be cleared from (the state machine's clear edges).
CLEARABLE_STATES = frozenset(task_sources(UseCase.CLEAR, TaskState.QUEUED))
#: Upstream states that keep a task from ever becoming ready.
_BLOCKING = frozenset(
    s.value
    for s in (TaskState.DEAD_LETTER, TaskState.UPSTREAM_FAILED, TaskState.CANCELLED, TaskState.SKIPPED)
)
#: Ended states that `only_failed` leaves alone.
_GOOD = frozenset({TaskState.SUCCESS.value, TaskState.SKIPPED.value})


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
    tasks = version.structure.tasks
    if task_ids is not None:
        if not task_ids:
            raise InvalidRequest("name at least one task to clear")
        unknown = sorted(set(task_ids) - set(tasks))
        if unknown:
            raise InvalidRequest(f"run {run_id!r} has no task {', '.join(map(repr, unknown))}")
    # Instances first, then (in reopen_run) the run, in the order every party locks them.
    instances = clear_store.lock_instances(conn, run_id)
    states = {i.task_id: i.state for i in instances}
    named = set(tasks) if task_ids is None else set(task_ids)
    if only_failed:
        named = {t for t in named if states.get(t) not in _GOOD}
    targets = set(named)
    if downstream:
        for task_id in named:
            targets.update(version.all_downstream(task_id))
    targets &= set(states)
    if not targets:
        return []
    _refuse_active(run_id, targets, states)
    order = [t for t in topological_order(version.structure.upstream_map()) if t in targets]
    resets, queued = _plan(version, order, states, instances)
    recounts = _recounts(version, targets, states, instances)
    now = db_now(conn)
    moved = clear_store.reset_instances(conn, resets, now=now) + clear_store.recount_pending(conn, recounts)
    if moved != len(resets) + len(recounts):
        raise ClearConflict(run_id=run_id)
    reopen_run(conn, run_id, now=now)
    audit.record(
        conn,
        at=now,
        actor=actor,
        action="task.clear",
        target=f"run:{run_id}",
        details={
            "reason": reason,
            "tasks": order,
            "requested": sorted(set(task_ids)) if task_ids is not None else None,
            "downstream": downstream,
            "only_failed": only_failed,
        },
    )
    if queued:
        dialects.notify_ready(conn)
    return order


def _refuse_active(run_id: str, targets: set[str], states: dict[str, str]) -> None:
    """InvalidRequest naming every target instance that has not finished."""
    active = sorted(t for t in targets if states[t] not in CLEARABLE_STATES)
    if active:
        listed = ", ".join(f"{t} ({states[t]})" for t in active)
        raise InvalidRequest(
            f"cannot clear task(s) of run {run_id!r} that have not finished: {listed}; "
            "wait for them to end or cancel them first"
        )


def _recounts(
    version: DagVersion,
    targets: set[str],
    states: dict[str, str],
    instances: list[clear_store.InstanceState],
) -> list[tuple[int, int]]:
    """Upstream counters of pending instances left out of the clear that follow a cleared task.

    Their counter may count a cleared upstream's earlier success; it would be counted again
    when that upstream succeeds anew, readying them too early.
    """
    upstream = version.structure.upstream_map()
    counts = []
    for inst in instances:
        ups = upstream.get(inst.task_id, ())
        if inst.task_id in targets or states[inst.task_id] != TaskState.PENDING.value:
            continue
        if any(u in targets for u in ups):
            done = sum(1 for u in ups if u not in targets and states.get(u) == TaskState.SUCCESS.value)
            counts.append((inst.id, done))
    return counts


def _plan(
    version: DagVersion,
    order: list[str],
    states: dict[str, str],
    instances: list[clear_store.InstanceState],
) -> tuple[list[clear_store.Reset], bool]:
    """The resets of the targets (in dependency order) and whether any becomes queued."""
    upstream = version.structure.upstream_map()
    final = dict(states)
    by_task = {i.task_id: i for i in instances}
    resets: list[clear_store.Reset] = []
    any_queued = False
    targets = set(order)
    for task_id in order:
        ups = upstream[task_id]
        blocked = sorted(u for u in ups if u not in targets and final.get(u) in _BLOCKING)
        if blocked:
            listed = ", ".join(f"{u} ({final[u]})" for u in blocked)
            raise InvalidRequest(
                f"task {task_id!r} could never run: its upstream {listed} is not being cleared; "
                "clear that upstream too (with --downstream to include what follows it)"
            )
        done = sum(1 for u in ups if final.get(u) == TaskState.SUCCESS.value)
        queued = done == len(ups)
        final[task_id] = (TaskState.QUEUED if queued else TaskState.PENDING).value
        any_queued = any_queued or queued
        inst = by_task[task_id]
        resets.append(
            clear_store.Reset(
                id=inst.id, expected=inst.state, attempt=inst.attempt, queued=queued, upstream_done=done
            )
        )
    return resets, any_queued
