"""Plain values of DAGs and runs that the store returns and the engine, CLI and worker pass
around. Those of task instances, attempts and workers are in task_records.py: listing runs, which
every `treadle runs list` does in a new process, builds none of their classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class DagInfo:
    """A registered DAG."""

    dag_id: str
    owner: str
    description: str
    tags: tuple[str, ...]
    fileloc: str
    is_paused: bool
    latest_version_id: int | None
    version_hash: str | None
    updated_at: datetime
    max_active_tasks: int | None = None
    #: The team that owns the DAG.
    team: str = "default"
    #: False once a sync of its folder found its file gone or no longer defining it; its runs
    #: and history stay, it cannot be triggered or scheduled until a sync finds it again.
    is_active: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadErrorInfo:
    """A DAG file that failed to load."""

    fileloc: str
    message: str
    traceback: str
    recorded_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """One DAG run."""

    run_id: str
    dag_id: str
    dag_version_id: int
    run_type: str
    logical_date: datetime
    state: str
    conf: dict[str, Any]  # Any: user JSON
    triggered_by: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    #: The data the run covers, [start, end); a scheduled run fires at its end.
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    #: `conf` validated against the DAG's params schema, defaults applied.
    params: dict[str, Any] | None = None  # Any: user JSON
    manifest: dict[str, Any] | None = None  # Any: JSON
    mode: str = "normal"
    backfill_id: int | None = None
    leader_epoch: int | None = None
