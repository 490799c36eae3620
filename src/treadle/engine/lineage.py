"""OpenLineage events written to the outbox with the change that causes them: a run's START
with its row, its COMPLETE/FAIL/ABORT with its close, an attempt's START with its start and its
COMPLETE/FAIL/ABORT with its end (domain/lineage.py builds them).

Only when lineage is on (`Database.lineage_namespace`, set from TREADLE_OPENLINEAGE_URL or
_FILE): otherwise each hook returns at its first line, so the worker's hot path pays nothing.
Datasets: a run reads its DAG's inputs (declared inlets, the datasets it is scheduled on) and
writes its outputs; a task writes its outlets and, when it has no upstream, reads the DAG's
inputs (treadle declares inlets per DAG, not per task).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagStructure
from treadle.domain.lineage import LineageEventType, run_event, task_event
from treadle.domain.outbox import OutboxKind
from treadle.domain.records import RunInfo
from treadle.domain.states import RunState
from treadle.domain.task_records import ClaimedTask
from treadle.engine.versions import version_of
from treadle.store import outbox as outbox_store
from treadle.store import runs as run_store
from treadle.store.database import Database, db_now

#: The sink name lineage entries carry (delivered by delivery/lineage.py).
SINK = "openlineage"

_RUN_END = {
    RunState.SUCCESS: LineageEventType.COMPLETE,
    RunState.FAILED: LineageEventType.FAIL,
    RunState.CANCELLED: LineageEventType.ABORT,
}


def _structure(db: Database, conn: Connection, version_id: int) -> DagStructure:
    return version_of(db, conn, version_id).structure


def _write(conn: Connection, payloads: list[dict[str, object]]) -> None:
    if payloads:
        outbox_store.enqueue(
            conn, kind=OutboxKind.LINEAGE.value, sink=SINK, payloads=payloads, now=db_now(conn)
        )


def runs_started(db: Database, conn: Connection, runs: Sequence[RunInfo]) -> None:
    """START of each new run (in the transaction that inserts them)."""
    namespace = db.lineage_namespace
    if namespace is None or not runs:
        return
    payloads: list[dict[str, object]] = []
    for run in runs:
        structure = _structure(db, conn, run.dag_version_id)
        payloads.append(
            run_event(
                event_type=LineageEventType.START,
                at=run.started_at or run.created_at,
                namespace=namespace,
                dag_id=run.dag_id,
                run_id=run.run_id,
                inputs=structure.inputs(),
                outputs=structure.outputs(),
            )
        )
    _write(conn, payloads)


def run_ended(db: Database, conn: Connection, run_id: str, state: RunState) -> None:
    """COMPLETE, FAIL or ABORT of a run that just took `state` (in the closing transaction)."""
    namespace = db.lineage_namespace
    if namespace is None:
        return
    run = run_store.get_run(conn, run_id)
    if run is None:
        return
    structure = _structure(db, conn, run.dag_version_id)
    payload = run_event(
        event_type=_RUN_END[state],
        at=run.ended_at or db_now(conn),
        namespace=namespace,
        dag_id=run.dag_id,
        run_id=run_id,
        inputs=structure.inputs(),
        outputs=structure.outputs(),
    )
    _write(conn, [payload])


def _task_payload(
    db: Database,
    conn: Connection,
    task: ClaimedTask,
    event_type: LineageEventType,
    at: datetime,
    namespace: str,
) -> dict[str, object]:
    structure = _structure(db, conn, task.dag_version_id)
    spec = structure.tasks[task.task_id]
    return task_event(
        event_type=event_type,
        at=at,
        namespace=namespace,
        dag_id=task.dag_id,
        run_id=task.run_id,
        task_id=task.task_id,
        map_index=task.map_index,
        attempt=task.attempt,
        inputs=() if spec.upstream else structure.inputs(),
        outputs=spec.outlets,
    )


def attempts_started(db: Database, conn: Connection, tasks: Sequence[ClaimedTask | None]) -> None:
    """START of each attempt that just began (None: one that did not; skipped)."""
    namespace = db.lineage_namespace
    if namespace is None:
        return
    payloads = [
        _task_payload(db, conn, t, LineageEventType.START, t.started_at, namespace)
        for t in tasks
        # A sensor's later pokes continue the attempt its first poke started.
        if t is not None and t.started_at is not None and t.first_poke_at is None
    ]
    _write(conn, payloads)


def attempts_ended(
    db: Database,
    conn: Connection,
    ended: Sequence[tuple[ClaimedTask, datetime]],
    event_type: LineageEventType,
) -> None:
    """COMPLETE, FAIL or ABORT of attempts that just ended, each at its end time."""
    namespace = db.lineage_namespace
    if namespace is None:
        return
    _write(conn, [_task_payload(db, conn, t, event_type, at, namespace) for t, at in ended])
