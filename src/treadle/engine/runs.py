"""Triggering runs and closing them once every task instance is terminal."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.admission import NO_LIMITS, AdmissionLimits
from treadle.domain.conf_limits import check_conf_limits
from treadle.domain.dag_version import DagStructure, DagVersion
from treadle.domain.durations import DEFAULT_TASK_TIMEOUT_S
from treadle.domain.manifest import DatasetConsumption, build_manifest
from treadle.domain.params import resolve_params
from treadle.domain.records import DagInfo, RunInfo
from treadle.domain.secret_params import mask_run, mask_secrets
from treadle.domain.states import TERMINAL_RUN_STATES, RunState, RunType, TaskState
from treadle.domain.transitions import UseCase
from treadle.domain.trigger_rules import TriggerRule
from treadle.engine import lineage
from treadle.engine.admission import record_refusal, require_admission
from treadle.engine.versions import version_of
from treadle.errors import DagInactive, DagNotFound, Overloaded, RunCancelledError, RunNotAllowed, RunNotFound
from treadle.store import audit, dialects
from treadle.store import dags as dag_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

#: Backfill task instances are claimed after every live one (same relative order among
#: themselves): a backfill catches up in the slots live work leaves free.
BACKFILL_PRIORITY_OFFSET = 1_000_000


def trigger_run(
    db: Database,
    dag_id: str,
    *,
    conf: dict[str, Any] | None = None,
    triggered_by: str,
    run_type: RunType = RunType.MANUAL,
    default_queue_timeout_s: float = 600.0,
    default_task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S,
    address: str | None = None,
    admission: AdmissionLimits = NO_LIMITS,
    check: Callable[[DagInfo], None] | None = None,
    masked: bool = False,
) -> RunInfo:
    """Create a run of the DAG's latest version with its roots queued, in one transaction.

    A manual run of a DAG whose contract sets `manual_runs=False` is refused (RunNotAllowed), and
    any run of an inactive DAG (DagInactive: its file is gone or no longer defines it).
    The conf is validated against the DAG's params schema and rules first (every violation
    reported with its JSON path, nothing created). Tasks without their own `queue_timeout` get
    `default_queue_timeout_s`, those without a `timeout` `default_task_timeout_s` (None: none),
    the deployment's. The trigger is audited (`run.trigger`, by `triggered_by`, from `address`)
    in the same transaction, its conf with secret params masked.

    A run whose queued task instances would exceed an `admission` limit is refused with
    Overloaded (nothing created; the refusal audited as `admission.refused` and counted).

    `check(dag)` runs once the DAG is read, in the transaction, and may refuse (the API's
    permission check on the DAG's team); `masked` returns the run as operators see it, its
    secret params masked.
    """
    conf = dict(conf or {})
    check_conf_limits(conf)

    def work(conn: Connection) -> RunInfo:
        dag = dag_store.get_dag(conn, dag_id)
        if dag is None or dag.latest_version_id is None:
            raise DagNotFound(f"no DAG {dag_id!r} is registered (run `treadle dags sync`?)")
        if check is not None:
            check(dag)
        if not dag.is_active:
            raise DagInactive(dag_id=dag_id, fileloc=dag.fileloc)
        version = version_of(db, conn, dag.latest_version_id)
        require_run_allowed(version.structure, run_type)
        structure = version.structure
        params = resolve_params(dag_id, structure.params_schema, conf, rules=structure.param_rules)
        now = db_now(conn)
        run, rows = new_run(
            version,
            run_type=run_type,
            logical_date=now,
            data_interval=(now, now),
            conf=conf,
            params=params,
            triggered_by=triggered_by,
            now=now,
            default_queue_timeout_s=default_queue_timeout_s,
            default_task_timeout_s=default_task_timeout_s,
        )
        require_admission(
            conn, admission, dag_id=dag_id, adding=queued_per_queue(rows), what=f"a run of DAG {dag_id!r}"
        )
        run_store.insert_run(conn, run)
        lineage.runs_started(db, conn, [run])
        ti_store.insert_task_instances(conn, rows)
        audit.record(
            conn,
            at=now,
            actor=triggered_by,
            action="run.trigger",
            target=run.run_id,
            details={"dag_id": dag_id, "conf": mask_secrets(conf, version.structure.params_schema)},
            address=address,
        )
        dialects.notify_ready(conn)
        return mask_run(run, structure.params_schema) if masked else run

    # Two manual triggers in one clock tick (SQLite's clock has millisecond resolution) would
    # share a logical date; retrying reads the clock again. Time-based runs must not retry: for
    # them the unique key is what forbids a double fire.
    try:
        return db.transact(work, retry_conflicts=run_type is RunType.MANUAL)
    except Overloaded as exc:
        record_refusal(db, exc, kind="trigger", dag_id=dag_id, actor=triggered_by, address=address)
        raise


def queued_per_queue(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many of these new task-instance rows are queued, per queue."""
    counts: dict[str, int] = {}
    for row in rows:
        if row["state"] == TaskState.QUEUED.value:
            counts[row["queue"]] = counts.get(row["queue"], 0) + 1
    return counts


def require_run_allowed(structure: DagStructure, run_type: RunType) -> None:
    """Raise RunNotAllowed when the DAG's contract refuses runs of this type (manual, backfill)."""
    contract = structure.contract
    if run_type is RunType.MANUAL and not contract.manual_runs:
        raise RunNotAllowed(
            dag_id=structure.dag_id, run_kind="manual runs", setting="manual_runs", owner=structure.owner
        )
    if run_type is RunType.BACKFILL and not contract.backfills:
        raise RunNotAllowed(
            dag_id=structure.dag_id, run_kind="backfills", setting="backfills", owner=structure.owner
        )


def new_run(
    version: DagVersion,
    *,
    run_type: RunType,
    logical_date: datetime,
    data_interval: tuple[datetime, datetime],
    conf: dict[str, Any],
    params: dict[str, Any],
    triggered_by: str,
    now: datetime,
    default_queue_timeout_s: float,
    mode: str = "normal",
    backfill_id: int | None = None,
    leader_epoch: int | None = None,
    consumed: DatasetConsumption | None = None,
    default_task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S,
) -> tuple[RunInfo, list[dict[str, Any]]]:
    """The row of a new running run (with its manifest) and the rows of its task instances.

    A task without its own `timeout` gets `default_task_timeout_s` (None: no timeout), stored on
    its instance; clears and requeues keep the instance's timeout.
    """
    structure = version.structure
    run_id = f"{run_type.value}__{logical_date:%Y%m%dT%H%M%S.%f}Z__{secrets.token_hex(4)}"
    manifest = build_manifest(
        run_id=run_id,
        dag_id=structure.dag_id,
        version_hash=version.version_hash,
        logical_date=logical_date,
        data_interval=data_interval,
        run_type=run_type.value,
        mode=mode,
        params=params,
        triggered_by=triggered_by,
        requested_at=now,
        backfill_id=backfill_id,
        consumed=consumed,
    )
    run = RunInfo(
        run_id=run_id,
        dag_id=structure.dag_id,
        dag_version_id=version.id,
        run_type=run_type.value,
        logical_date=logical_date,
        state=RunState.RUNNING.value,
        conf=conf,
        triggered_by=triggered_by,
        created_at=now,
        started_at=now,
        ended_at=None,
        data_interval_start=data_interval[0],
        data_interval_end=data_interval[1],
        params=params,
        manifest=manifest,
        mode=mode,
        backfill_id=backfill_id,
        leader_epoch=leader_epoch,
    )
    offset = -BACKFILL_PRIORITY_OFFSET if run_type is RunType.BACKFILL else 0
    return run, _task_instance_rows(
        structure,
        run,
        default_queue_timeout_s=default_queue_timeout_s,
        default_task_timeout_s=default_task_timeout_s,
        priority_offset=offset,
    )


def _task_instance_rows(
    structure: DagStructure,
    run: RunInfo,
    *,
    default_queue_timeout_s: float,
    default_task_timeout_s: float | None,
    priority_offset: int = 0,
) -> list[dict[str, Any]]:
    rows = []
    for task_id, t in structure.tasks.items():
        # Roots, and tasks whose trigger rule is `always`, are ready from the start.
        is_root = not t.upstream or t.trigger_rule == TriggerRule.ALWAYS.value
        queue_timeout = t.queue_timeout_s or default_queue_timeout_s
        rows.append(
            {
                "run_id": run.run_id,
                "dag_id": run.dag_id,
                "task_id": task_id,
                "map_index": -1,
                "state": (TaskState.QUEUED if is_root else TaskState.PENDING).value,
                "attempt": 0,
                "budget_base": 0,
                "orphaned_count": 0,
                "queue": t.queue,
                # A sensor's pokes rank just below its weight: among equals, other work goes first.
                "priority_weight": t.priority_weight + priority_offset - (1 if t.sensor is not None else 0),
                "upstream_total": len(t.upstream),
                "upstream_done": 0,
                "queued_at": run.created_at if is_root else None,
                "pool": t.pool,
                "pool_slots": t.pool_slots,
                "queue_timeout_s": queue_timeout,
                "dispatch_deadline": run.created_at + timedelta(seconds=queue_timeout) if is_root else None,
                "timeout_s": t.timeout_s if t.timeout_s is not None else default_task_timeout_s,
            }
        )
    return rows


def close_run_if_done(db: Database, conn: Connection, run_id: str) -> RunState | None:
    """Close a running run whose task instances are all terminal; returns the state it took.

    The closing half of the run open/close protocol (docs/architecture.md), used by every
    closer: a completion, a failure's propagation, a cancel, the sweep. An unlocked probe may
    skip the close (a concurrent transaction may end the last active instance; the sweep then
    closes the run). A close is decided only under the run-row lock, by a probe made after the
    lock was granted: a reopener holds that lock until it commits, so either it sees this
    close and reopens the run, or this probe sees its active instance.
    """
    if run_store.has_active_tasks(conn, run_id):
        return None
    if run_store.lock_run_state(conn, run_id) is not RunState.RUNNING:
        return None
    if run_store.has_active_tasks(conn, run_id):
        return None
    new = RunState.FAILED if run_store.has_unsuccessful_tasks(conn, run_id) else RunState.SUCCESS
    changed = run_store.set_run_state(conn, run_id, by=UseCase.CLOSE, new=new, now=db_now(conn))
    if not changed:
        return None
    lineage.run_ended(db, conn, run_id, new)
    return new


def reopen_run(conn: Connection, run_id: str, *, now: datetime, requeued_task: str | None = None) -> RunState:
    """Make a run running again after this transaction made one of its task instances active.

    The reopening half of the protocol: called after the task-instance writes (instances are
    always locked before their run, by every party), it locks the run row and moves a finished
    run back to running. A clear (an explicit operator decision) reopens a cancelled run too; a
    requeue (`requeued_task` names its task) does not: RunCancelledError rolls the caller's
    transaction back. Returns the state the run had.
    """
    state = run_store.lock_run_state(conn, run_id)
    if state is None:
        raise RunNotFound(f"no run {run_id!r}")
    if state is RunState.CANCELLED and requeued_task is not None:
        raise RunCancelledError(run_id=run_id, task_id=requeued_task)
    if state in TERMINAL_RUN_STATES:
        run_store.set_run_state(
            conn, run_id, by=UseCase.REOPEN, new=RunState.RUNNING, now=now, expected=state
        )
    return state


def cancel_run_row(db: Database, conn: Connection, run_id: str, *, now: datetime) -> bool:
    """Close a run as cancelled (the caller cancelled its active instances under the run lock)."""
    if not run_store.set_run_state(conn, run_id, by=UseCase.CANCEL, new=RunState.CANCELLED, now=now):
        return False
    lineage.run_ended(db, conn, run_id, RunState.CANCELLED)
    return True


def finish_idle_runs(db: Database, *, limit: int = 500) -> int:
    """Sweep: close every running run that has no active task instance left.

    Each run is closed in its own short transaction, so a run lock is never held while others
    are examined.
    """

    def candidates(conn: Connection) -> list[str]:
        return run_store.idle_running_run_ids(conn, limit=limit)

    closed = 0
    for run_id in db.query(candidates):

        def close(conn: Connection, run_id: str = run_id) -> RunState | None:
            return close_run_if_done(db, conn, run_id)

        closed += db.transact(close) is not None
    return closed
