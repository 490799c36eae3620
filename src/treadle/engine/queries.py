"""Read-only views for the CLI (and later the API): DAGs, load errors, runs and their details.

Store modules that only some views need are imported by those views: `treadle runs list` (a
new process each time) imports what listing runs needs and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from treadle.domain.graph import topological_order
from treadle.domain.records import DagInfo, LoadErrorInfo, RunInfo
from treadle.domain.secret_params import mask_run
from treadle.domain.task_records import AttemptInfo, TaskInstanceInfo, WorkerInfo
from treadle.errors import DagNotFound, RunNotFound
from treadle.store import dags as dag_store
from treadle.store import runs as run_store
from treadle.store.database import Database, db_now

if TYPE_CHECKING:
    from treadle.domain.dag_version import DagStructure, DagVersion


@dataclass(frozen=True, slots=True, kw_only=True)
class RunDetail:
    """A run with its task instances (in the DAG's topological order, ties by task id), attempts
    and results."""

    run: RunInfo
    task_instances: list[TaskInstanceInfo]
    attempts: list[AttemptInfo]
    results: dict[str, Any]  # Any: user JSON


def list_dags(db: Database) -> list[DagInfo]:
    """Every registered DAG."""
    return db.query(dag_store.list_dags)


def get_dag(db: Database, dag_id: str) -> DagInfo | None:
    """One DAG, or None."""
    return db.query(lambda conn: dag_store.get_dag(conn, dag_id))


def list_load_errors(db: Database) -> list[LoadErrorInfo]:
    """Every DAG file that failed to load."""
    return db.query(dag_store.list_load_errors)


def list_runs(db: Database, *, dag_id: str | None = None, limit: int = 50) -> list[RunInfo]:
    """The newest runs, secret params masked."""

    def work(conn: Connection) -> list[RunInfo]:
        return runs_for_operators(db, conn, run_store.list_runs(conn, dag_id=dag_id, limit=limit))

    return db.query(work)


def runs_for_operators(db: Database, conn: Connection, runs: list[RunInfo]) -> list[RunInfo]:
    """The runs as operators may see them: params their DAG version marks secret masked."""
    from treadle.engine.versions import params_schemas_of

    schemas = params_schemas_of(db, conn, {r.dag_version_id for r in runs})
    return [mask_run(r, schemas[r.dag_version_id]) for r in runs]


def run_for_operators(db: Database, run: RunInfo) -> RunInfo:
    """One run as operators may see it (see runs_for_operators)."""
    (shown,) = db.query(lambda conn: runs_for_operators(db, conn, [run]))
    return shown


def task_instance(db: Database, task_instance_id: int) -> TaskInstanceInfo | None:
    """One task instance by id, in whatever state (None: no such id)."""
    from treadle.store import task_instances as ti_store

    return db.query(lambda conn: ti_store.get_task_instance(conn, task_instance_id))


def run_detail(db: Database, run_id: str) -> RunDetail:
    """A run with everything recorded about it, secret params masked."""
    from treadle.store import attempts as attempt_store
    from treadle.store import task_instances as ti_store

    def work(conn: Connection) -> RunDetail:
        run = run_store.get_run(conn, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        (shown,) = runs_for_operators(db, conn, [run])
        from treadle.engine.versions import versions_of

        structure = versions_of(db, conn, [run.dag_version_id])[run.dag_version_id].structure
        return RunDetail(
            run=shown,
            task_instances=in_task_order(ti_store.list_for_run(conn, run_id), structure),
            attempts=attempt_store.list_attempts(conn, run_id=run_id),
            results=attempt_store.results_of_run(conn, run_id),
        )

    return db.query(work)


def in_task_order(instances: list[TaskInstanceInfo], structure: DagStructure) -> list[TaskInstanceInfo]:
    """Task instances in the DAG's topological order (ties by task id), a mapped task's
    instances by map index; instances of tasks the version does not know come last."""
    order = topological_order({t: d.upstream for t, d in structure.tasks.items()})
    position = {task_id: n for n, task_id in enumerate(order)}
    return sorted(
        instances, key=lambda t: (position.get(t.task_id, len(order)), t.task_id, t.map_index, t.id)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueView:
    """A queue: depth, oldest wait, and the live workers serving it."""

    queue: str
    queued: int
    running: int
    oldest_queued_age_s: float | None
    workers: tuple[str, ...]


def list_queues(db: Database, *, worker_stale_s: float) -> list[QueueView]:
    """Every queue with work or a live worker, by name."""
    from treadle.store import queues as queue_store
    from treadle.store import workers as worker_store

    def work(conn: Connection) -> list[QueueView]:
        now = db_now(conn)
        stats = {s.queue: s for s in queue_store.queue_stats(conn)}
        from treadle.engine.diagnosis import live_workers

        live = live_workers(worker_store.list_workers(conn), now=now, stale_s=worker_stale_s)
        names = sorted(set(stats) | {q for w in live for q in w.queues})
        views = []
        for name in names:
            s = stats.get(name)
            oldest = s.oldest_queued_at if s else None
            views.append(
                QueueView(
                    queue=name,
                    queued=s.queued if s else 0,
                    running=s.running if s else 0,
                    oldest_queued_age_s=(now - oldest).total_seconds() if oldest else None,
                    workers=tuple(w.worker_id for w in live if name in w.queues),
                )
            )
        return views

    return db.query(work)


def list_workers(db: Database) -> list[WorkerInfo]:
    """Every known worker with its capacity and load at its last heartbeat."""
    from treadle.store import workers as worker_store

    return db.query(worker_store.list_workers)


def list_runs_page(
    db: Database,
    *,
    dag_id: str | None = None,
    state: str | None = None,
    run_type: str | None = None,
    teams: frozenset[str] | None = None,
    before: tuple[datetime, str] | None = None,
    limit: int = 50,
) -> list[RunInfo]:
    """One page of runs, newest first, secret params masked (see store.runs.list_runs_page)."""

    def work(conn: Connection) -> list[RunInfo]:
        page = run_store.list_runs_page(
            conn, dag_id=dag_id, state=state, run_type=run_type, teams=teams, before=before, limit=limit
        )
        return runs_for_operators(db, conn, page)

    return db.query(work)


def dag_structure(db: Database, dag_id: str) -> DagStructure:
    """The structure of a DAG's latest version (tasks, edges, schedule, params schema)."""
    return dag_version(db, dag_id).structure


def dag_version(db: Database, dag_id: str) -> DagVersion:
    """A DAG's latest version (id, content hash, structure); DagNotFound if none."""

    def work(conn: Connection) -> DagVersion:
        dag = dag_store.get_dag(conn, dag_id)
        if dag is None or dag.latest_version_id is None:
            raise DagNotFound(f"no DAG {dag_id!r} is registered")
        from treadle.engine.versions import versions_of

        return versions_of(db, conn, [dag.latest_version_id])[dag.latest_version_id]

    return db.query(work)


def dag_teams(db: Database) -> dict[str, str]:
    """DAG id -> the team that owns it."""
    return {d.dag_id: d.team for d in list_dags(db)}
