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
    #: The run's parameters (the trigger's conf). Any: user JSON.
    params: dict[str, Any] = field(default_factory=dict)
    #: Results of upstream tasks by task id. Any: user JSON.
    upstream_results: dict[str, Any] = field(default_factory=dict)
