"""The context a running task receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskContext:
    """What a task knows about the attempt it runs in.

    A task function receives it when it declares a parameter named `context`.
    """

    run_id: str
    dag_id: str
    task_id: str
    logical_date: datetime
    #: 1-based number of this attempt of the task instance.
    attempt: int
    #: The run's params: the trigger's conf validated by the DAG's schema, defaults applied.
    #: Any: user JSON.
    params: dict[str, Any] = field(default_factory=dict)
    #: The run manifest (run id, DAG version hash, logical date, data interval, run type and
    #: mode, params, who asked and when). Any: JSON.
    manifest: dict[str, Any] = field(default_factory=dict)
    #: The manifest as a JSON file (also in the environment as TREADLE_MANIFEST_FILE) for
    #: commands the task starts; None outside a worker.
    manifest_path: str | None = None
    #: Results of upstream tasks by task id. Any: user JSON.
    upstream_results: dict[str, Any] = field(default_factory=dict)
