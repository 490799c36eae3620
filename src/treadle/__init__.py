"""treadle: workflow orchestrator and distributed job scheduler.

The public authoring API: `dag`, `task`, `Param`, `ParamRule`, `Dataset` and the `TaskContext` a
task receives.
"""

from __future__ import annotations

from treadle.authoring.context import TaskContext
from treadle.authoring.datasets import Dataset
from treadle.authoring.decorators import dag, task
from treadle.authoring.params import Param, ParamRule
from treadle.authoring.specs import Dag, TaskOutput

__all__ = ["Dag", "Dataset", "Param", "ParamRule", "TaskContext", "TaskOutput", "dag", "task"]
__version__ = "0.1.0"
