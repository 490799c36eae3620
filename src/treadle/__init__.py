"""treadle: workflow orchestrator and distributed job scheduler.

The public authoring API: `dag`, `task` and the `TaskContext` a task receives.
"""

from __future__ import annotations

from treadle.authoring.context import TaskContext
from treadle.authoring.decorators import dag, task
from treadle.authoring.specs import Dag, TaskOutput

__all__ = ["Dag", "TaskContext", "TaskOutput", "dag", "task"]
__version__ = "0.1.0"
