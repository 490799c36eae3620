""" "Why is it not running?": the first condition holding each waiting task instance, and who holds it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import TaskDef
from treadle.domain.sensing import PokeKind, SensorSpec, poke_deadline
from treadle.domain.states import TERMINAL_TASK_STATES, TaskState
from treadle.domain.task_records import TaskInstanceInfo, WorkerInfo
from treadle.domain.trigger_rules import DEFAULT_RULE
from treadle.engine.versions import version_of
from treadle.errors import InvalidRequest, RunNotFound
from treadle.store import attempts as attempt_store
from treadle.store import dags as dag_store
from treadle.store import limits
from treadle.store import pokes as poke_store
from treadle.store import pools as pool_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store import workers as worker_store
from treadle.store.database import Database, db_now


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """Why one task instance is where it is."""

    task_instance_id: int
    task_id: str
    state: str
    reason: str
    #: Who holds what it waits for (task instances, workers), when that applies.
    held_by: tuple[str, ...] = ()
    #: Position of a mapped instance; -1 for a task that is not mapped (or not yet expanded).
    map_index: int = -1


def live_workers(workers: list[WorkerInfo], *, now: datetime, stale_s: float) -> list[WorkerInfo]:
    """Workers that heartbeated within `stale_s` and are not stopped."""
    return [
        w for w in workers if w.state == "running" and w.last_heartbeat_at >= now - timedelta(seconds=stale_s)
    ]


def queued_blocker(
    conn: Connection,
    *,
    queue: str,
    pool: str | None,
    pool_slots: int,
    dag_id: str,
    now: datetime,
    stale_s: float,
) -> tuple[str, tuple[str, ...]]:
    """The first condition keeping a queued task instance from being claimed, and its holders."""
    serving = [
        w
        for w in live_workers(worker_store.list_workers(conn), now=now, stale_s=stale_s)
        if queue in w.queues
    ]
    if not serving:
        return f"no live worker serves queue {queue!r}", ()
    if pool is not None:
        sizes = {p.name: p for p in pool_store.list_pools(conn, [pool])}
        if pool not in sizes:
            return f"pool {pool!r} does not exist (create it with `treadle pools set {pool} SLOTS`)", ()
        info = sizes[pool]
        if pool_slots > info.slots:
            return f"needs {pool_slots} slot(s) of pool {pool!r}, which has only {info.slots}", ()
        if info.used_slots + pool_slots > info.slots:
            holders = tuple(
                f"task instance {i} ({run} / {task}, {n} slot(s))"
                for i, run, task, n in pool_store.holders(conn, pool)
            )
            return f"pool {pool!r} is full ({info.used_slots}/{info.slots} slots in use)", holders
    dag = dag_store.get_dag(conn, dag_id)
    broken = dag_store.load_error(conn, dag.fileloc) if dag is not None and dag.fileloc else None
    if broken is not None:
        return (
            f"its DAG file {broken.fileloc} fails to load on the workers ({broken.message[:200]}); "
            "fix the file (`treadle dags errors` shows the traceback)",
            (),
        )
    if dag is not None and dag.max_active_tasks is not None:
        running = limits.running_per_dag(conn, [dag_id])[dag_id]
        if running >= dag.max_active_tasks:
            return f"DAG {dag_id!r} has max_active_tasks={dag.max_active_tasks} running", ()
    capacity = sum(w.concurrency for w in serving)
    busy = sum(w.active for w in serving)
    names = tuple(f"worker {w.worker_id} ({w.active}/{w.concurrency} busy)" for w in serving)
    if busy >= capacity:
        return f"every worker serving queue {queue!r} is busy ({busy}/{capacity} slots)", names
    return f"ready: waiting to be claimed from queue {queue!r}", names


def why(db: Database, run_id: str, task_id: str | None = None, *, worker_stale_s: float) -> list[Waiting]:
    """Explain each non-terminal task instance of a run (or just `task_id`)."""

    def work(conn: Connection) -> list[Waiting]:
        run = run_store.get_run(conn, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        every = [t for t in ti_store.list_for_run(conn, run_id) if t.map_index >= -1]
        states = _task_states(every)
        instances = every
        if task_id is not None:
            instances = [t for t in instances if t.task_id == task_id]
            if not instances:
                raise InvalidRequest(f"run {run_id!r} has no task {task_id!r}")
        now = db_now(conn)
        structure = version_of(db, conn, run.dag_version_id).structure
        return [
            waiting_poke(conn, t, structure.tasks[t.task_id].sensor, now=now)
            if t.state == TaskState.UP_FOR_RESCHEDULE.value
            else _explain(conn, t, structure.tasks[t.task_id], states, now=now, stale_s=worker_stale_s)
            for t in instances
        ]

    return db.query(work)


def _task_states(instances: list[TaskInstanceInfo]) -> dict[str, str]:
    """Each task's state as a waiting task sees it: a mapped task's instances summed up."""
    grouped: dict[str, list[str]] = {}
    for t in instances:
        grouped.setdefault(t.task_id, []).append(t.state)
    summary = {}
    for task_id, found in grouped.items():
        if len(found) == 1:
            summary[task_id] = found[0]
            continue
        counts = Counter(found)
        summary[task_id] = f"{len(found)} mapped instances: " + ", ".join(
            f"{n} {state}" for state, n in sorted(counts.items())
        )
    return summary


def _pending_reason(
    t: TaskInstanceInfo, definition: TaskDef, states: dict[str, str]
) -> tuple[str, tuple[str, ...]]:
    """Why a pending instance waits: its upstreams under its rule, or a mapped sibling."""
    if t.map_index >= 0:
        return (
            f"held back by max_active_mapped={definition.max_active_mapped}: queued when one of "
            f"the active instances of {t.task_id} ends",
            (f"the active instances of {t.task_id}",),
        )
    open_ups = [
        f"{u} ({states.get(u)})" for u in definition.upstream if states.get(u) != TaskState.SUCCESS.value
    ]
    rule = (
        "" if definition.trigger_rule == DEFAULT_RULE.value else f" (trigger rule {definition.trigger_rule})"
    )
    maps = f"; then maps over the result of {definition.map_source}" if definition.map_source else ""
    return f"upstream not done{rule}: " + ", ".join(open_ups) + maps, tuple(open_ups)


def waiting_poke(conn: Connection, t: TaskInstanceInfo, spec: SensorSpec | None, *, now: datetime) -> Waiting:
    """Why a sensor (or a submitted job's poller) waits: its next poke, pokes so far, timeout."""
    row = poke_store.poke_row(conn, t.id)
    pokes = poke_store.count_pokes(conn, task_instance_id=t.id)
    first = row.first_poke_at if row is not None else None
    nxt = t.next_attempt_at.isoformat() if t.next_attempt_at else "?"
    what = (
        "submitted job still running"
        if spec is not None and spec.kind is PokeKind.DEFERRED
        else "condition not met yet"
    )
    timeout = "no timeout"
    if spec is not None and spec.timeout_s is not None:
        deadline = poke_deadline(spec, first)
        left = f", {max((deadline - now).total_seconds(), 0):.0f} s left" if deadline else ""
        then = "skipped (soft_fail)" if spec.soft_fail else "dead-lettered sensor_timeout"
        timeout = f"timeout {spec.timeout_s:g} s from the first poke{left}, then {then}"
    interval = f"every {spec.poke_interval_s:g} s" if spec is not None else ""
    started = f"; first poke {first.isoformat()}" if first else ""
    return Waiting(
        task_instance_id=t.id,
        task_id=t.task_id,
        state=t.state,
        reason=f"{what}: next poke at {nxt} ({interval}); pokes so far: {pokes}{started}; {timeout}. "
        "It holds no worker slot meanwhile",
    )


def _explain(
    conn: Connection,
    t: TaskInstanceInfo,
    definition: TaskDef,
    states: dict[str, str],
    *,
    now: datetime,
    stale_s: float,
) -> Waiting:
    def waiting(reason: str, held_by: tuple[str, ...] = ()) -> Waiting:
        return Waiting(
            task_instance_id=t.id,
            task_id=t.task_id,
            state=t.state,
            reason=reason,
            held_by=held_by,
            map_index=t.map_index,
        )

    if t.state in TERMINAL_TASK_STATES:
        return waiting(
            f"finished: {t.state}" + (f" ({t.dead_letter_reason})" if t.dead_letter_reason else "")
        )
    if t.state == TaskState.PENDING.value:
        return waiting(*_pending_reason(t, definition, states))
    if t.state == TaskState.RETRY_WAIT.value:
        last = attempt_store.last_attempts(conn, [t.id]).get(t.id)
        error = f" after attempt {last.attempt} ended {last.outcome}: {last.error_type}" if last else ""
        until = t.next_attempt_at.isoformat() if t.next_attempt_at else "?"
        return waiting(f"retry wait until {until}{error}")
    if t.state == TaskState.NEEDS_INSPECTION.value:
        last = attempt_store.last_attempts(conn, [t.id]).get(t.id)
        code = f" with exit code {last.exit_code}" if last and last.exit_code is not None else ""
        error = f": {last.error_type}: {(last.error_message or '')[:200]}" if last else ""
        return waiting(
            f"needs inspection: attempt {t.attempt} ended with an unknown commit{code}{error}; its output "
            "may be partly written, so it is never retried automatically. Inspect the output, then "
            f"`treadle tasks resolve {t.run_id} {t.task_id} --as success|failed|requeue --reason TEXT`",
            ("an operator",),
        )
    if t.state == TaskState.RUNNING.value:
        lease = t.lease_expires_at.isoformat() if t.lease_expires_at else "?"
        return waiting(
            f"running attempt {t.attempt} on worker {t.worker_id} (lease until {lease})",
            (f"worker {t.worker_id}",),
        )
    row = ti_store.get_queue_facts(conn, t.id)
    reason, held = queued_blocker(
        conn,
        queue=row.queue,
        pool=row.pool,
        pool_slots=row.pool_slots,
        dag_id=t.dag_id,
        now=now,
        stale_s=stale_s,
    )
    return waiting(reason, held)
