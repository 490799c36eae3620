"""treadle: workflow orchestrator and distributed job scheduler.

The public authoring API: `dag`, `task` (and `task.branch`, `task.command`), `CommandTask`,
`Param`, `ParamRule`, `Dataset`, `Alert` (alert rules), the `TaskContext` a task receives, the
outcomes a task raises
(`Retryable`, `NonRetryable`, `UnknownCommit`), `ExitContract`, quality gates (`quality_gate`,
`Check`), sensors (`sensor`, `Waiting`, `Ready`) and submit-then-poll tasks (`Deferred`,
`PollResult`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from treadle.authoring.alerts import Alert
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

#: Public name -> the module defining it. Imported on first use (PEP 562), so that processes
#: which never author DAGs (the CLI's read commands, the API) do not pay for jsonschema & co.
_EXPORTS: dict[str, str] = {
    "Alert": "treadle.authoring.alerts",
    "Check": "treadle.authoring.quality",
    "CommandTask": "treadle.authoring.commands",
    "Dag": "treadle.authoring.specs",
    "Dataset": "treadle.authoring.datasets",
    "Deferred": "treadle.authoring.sensing",
    "ExitContract": "treadle.domain.exit_codes",
    "NonRetryable": "treadle.authoring.outcomes",
    "Param": "treadle.authoring.params",
    "ParamRule": "treadle.authoring.params",
    "PollResult": "treadle.authoring.sensing",
    "Ready": "treadle.authoring.sensing",
    "Retryable": "treadle.authoring.outcomes",
    "TaskContext": "treadle.authoring.context",
    "TaskOutput": "treadle.authoring.specs",
    "UnknownCommit": "treadle.authoring.outcomes",
    "Waiting": "treadle.authoring.sensing",
    "dag": "treadle.authoring.decorators",
    "quality_gate": "treadle.authoring.quality",
    "sensor": "treadle.authoring.sensing",
    "task": "treadle.authoring.decorators",
}

__all__ = [
    "Alert",
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'treadle' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
