"""treadle: workflow orchestrator and distributed job scheduler.

The public authoring API: `dag`, `task` (and `task.branch`, `task.command`), `CommandTask`,
`Param`, `ParamRule`, `Dataset`, the `TaskContext` a task receives, the outcomes a task raises
(`Retryable`, `NonRetryable`, `UnknownCommit`), `ExitContract`, quality gates (`quality_gate`,
`Check`), sensors (`sensor`, `Waiting`, `Ready`) and submit-then-poll tasks (`Deferred`,
`PollResult`).
"""

from __future__ import annotations

from treadle.authoring.commands import CommandTask
from treadle.authoring.context import TaskContext
from treadle.authoring.datasets import Dataset
from treadle.authoring.decorators import dag, task
from treadle.authoring.outcomes import NonRetryable, Retryable, UnknownCommit
from treadle.authoring.params import Param, ParamRule
from treadle.authoring.quality import Check, quality_gate
from treadle.authoring.sensing import Deferred, PollResult, Ready, Waiting, sensor
from treadle.authoring.specs import Dag, TaskOutput
from treadle.domain.exit_codes import ExitContract

__all__ = [
    "Check",
    "CommandTask",
    "Dag",
    "Dataset",
    "Deferred",
    "ExitContract",
    "NonRetryable",
    "Param",
    "ParamRule",
    "PollResult",
    "Ready",
    "Retryable",
    "TaskContext",
    "TaskOutput",
    "UnknownCommit",
    "Waiting",
    "dag",
    "quality_gate",
    "sensor",
    "task",
]
__version__ = "0.1.0"
