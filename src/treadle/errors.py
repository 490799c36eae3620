"""The one error tree of treadle.

TreadleError
├── ConfigError            a setting is missing or invalid (names the setting)
├── DagDefinitionError     a DAG is malformed: cycle, unknown or duplicate task id, bad setting
├── DagNotFound            no DAG with that id is registered
├── RunNotFound            no run with that id
├── TaskInstanceNotFound   no task instance with that id
├── InvalidRequest         input from a user that cannot be accepted (names the problem)
│   └── RunCancelledError  a requeue would run work in a cancelled run (clear reopens it)
├── ClearConflict          task instances moved while a clear read them (nothing applied)
├── SchemaOutOfDate        the database schema is not at the code's revision
└── DatabaseUnavailable    the database cannot be reached (after retries)
"""

from __future__ import annotations


class TreadleError(Exception):
    """A treadle operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or type(self).__name__).strip())


class ConfigError(TreadleError):
    """A setting is missing or invalid."""


class DagDefinitionError(TreadleError):
    """The DAG definition is invalid."""


class DagNotFound(TreadleError):
    """No DAG with that id is registered."""


class RunNotFound(TreadleError):
    """No run with that id exists."""


class TaskInstanceNotFound(TreadleError):
    """No task instance with that id exists."""


class InvalidRequest(TreadleError):
    """The request cannot be accepted."""


class SchemaOutOfDate(TreadleError):
    """The database schema is not at the revision this code expects; run `treadle db upgrade`."""


class DatabaseUnavailable(TreadleError):
    """The database cannot be reached."""


class RunCancelledError(InvalidRequest):
    """The run was cancelled: work in it is not requeued; `treadle tasks clear` reopens it."""

    def __init__(self, *, run_id: str, task_id: str) -> None:
        self.run_id, self.task_id = run_id, task_id
        super().__init__(
            f"run {run_id!r} was cancelled, so task {task_id!r} is not requeued into it; to run it "
            f"again, reopen the run with `treadle tasks clear {run_id} {task_id}`"
        )


class ClearConflict(TreadleError):
    """Task instances of a run changed while they were being cleared (nothing was applied)."""

    def __init__(self, *, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"task instances of run {run_id!r} changed while being cleared; try again")
