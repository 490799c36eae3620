"""Which attempt a `treadle logs` request names, where its log file is, and whether it still runs.

Reads only; the log files themselves live on the hosts of the workers that ran the attempts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Connection

from treadle.domain.commands import attempt_log_path
from treadle.domain.states import TaskState
from treadle.errors import InvalidRequest, RunNotFound, TaskInstanceNotFound
from treadle.store import attempts as attempt_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptLocation:
    """One attempt of a task instance and where its log is."""

    task_instance_id: int
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    attempt: int
    #: The host of the worker that ran (or runs) it; None when not recorded.
    hostname: str | None
    #: True while this attempt is the task instance's running one.
    running: bool

    def log_path(self, logs_dir: Path) -> Path:
        """The attempt's log file under `logs_dir` (on the host that ran it)."""
        return attempt_log_path(
            logs_dir,
            dag_id=self.dag_id,
            run_id=self.run_id,
            task_id=self.task_id,
            map_index=self.map_index,
            attempt=self.attempt,
        )


def locate_attempt(
    db: Database, run_id: str, task_id: str, *, attempt: int | None = None, map_index: int = -1
) -> AttemptLocation:
    """The attempt `attempt` (default: the latest) of a run's task.

    Raises:
        RunNotFound: no such run.
        TaskInstanceNotFound: the run has no such task.
        InvalidRequest: the task has no attempt of that number (or none yet).
    """

    def work(conn: Connection) -> AttemptLocation:
        instance = ti_store.find_task_instance(conn, run_id=run_id, task_id=task_id, map_index=map_index)
        if instance is None:
            if run_store.get_run(conn, run_id) is None:
                raise RunNotFound(f"no run {run_id!r}")
            where = f" (map index {map_index})" if map_index >= 0 else ""
            raise TaskInstanceNotFound(f"run {run_id!r} has no task {task_id!r}{where}")
        if instance.attempt < 1:
            raise InvalidRequest(f"task {task_id!r} of run {run_id!r} has not started an attempt yet")
        number = instance.attempt if attempt is None else attempt
        if not 1 <= number <= instance.attempt:
            raise InvalidRequest(
                f"task {task_id!r} of run {run_id!r} has attempts 1..{instance.attempt}; "
                f"there is no attempt {number}"
            )
        running = number == instance.attempt and instance.state == TaskState.RUNNING.value
        hostname = instance.hostname if running else None
        if not running:
            recorded = attempt_store.get_attempt(conn, task_instance_id=instance.id, attempt=number)
            hostname = recorded.hostname if recorded is not None else None
        return AttemptLocation(
            task_instance_id=instance.id,
            dag_id=instance.dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
            attempt=number,
            hostname=hostname,
            running=running,
        )

    return db.query(work)


def is_running(db: Database, location: AttemptLocation) -> bool:
    """True while the located attempt is still its task instance's running one (one row read)."""

    def work(conn: Connection) -> bool:
        instance = ti_store.get_task_instance(conn, location.task_instance_id)
        return (
            instance is not None
            and instance.attempt == location.attempt
            and instance.state == TaskState.RUNNING.value
        )

    return db.query(work)
