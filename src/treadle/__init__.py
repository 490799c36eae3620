"""treadle: workflow orchestrator and distributed job scheduler.

The public authoring API: `dag`, `task`, `Param`, `Dataset`, the `TaskContext` a task receives,
the outcomes a task raises (`Retryable`, `NonRetryable`, `UnknownCommit`) and `ExitContract`;
sensors (`sensor`, `Waiting`, `Ready`) and submit-then-poll tasks (`Deferred`, `PollResult`).
"""

from __future__ import annotations

from treadle.authoring.context import TaskContext
from treadle.authoring.datasets import Dataset
from treadle.authoring.decorators import dag, task
from treadle.authoring.outcomes import NonRetryable, Retryable, UnknownCommit
from treadle.authoring.params import Param
from treadle.authoring.quality import Check, quality_gate
from treadle.authoring.sensing import Deferred, PollResult, Ready, Waiting, sensor
from treadle.authoring.specs import Dag, TaskOutput
from treadle.domain.exit_codes import ExitContract

__all__ = [
    "Check",
    "Dag",
    "Dataset",
    "Deferred",
    "ExitContract",
    "NonRetryable",
    "Param",
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
