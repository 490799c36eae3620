"""Exceptions a Python task raises to say how its attempt ended (the exit-code contract's classes).

    from treadle import NonRetryable, Retryable, UnknownCommit

    @task
    def load(context):
        if not source_ready():
            raise Retryable("source not ready", exit_code=20)
        if bad_config():
            raise NonRetryable("no target table configured", exit_code=10)
        try:
            write_and_commit()
        except TimeoutError as exc:
            # The commit may or may not have happened: an operator must look.
            raise UnknownCommit("commit timed out; output may be partly written") from exc

Any other exception is retryable (the retry policy decides), recorded with exit code 1;
`sys.exit(code)` is classified by the task's exit-code contract (`exit_codes=`), as a command
task's exit code is.
"""

from __future__ import annotations

from typing import Any

from treadle.domain.exit_codes import UNKNOWN_COMMIT, Disposition

#: The exit code recorded for a Python task that raised anything but a task outcome.
PYTHON_FAILURE_EXIT_CODE = 1


class TaskOutcome(Exception):
    """Base of the exceptions that classify a task's failure."""

    disposition: Disposition = Disposition.RETRYABLE
    default_exit_code: int = PYTHON_FAILURE_EXIT_CODE

    def __init__(
        self, message: str = "", *, exit_code: int | None = None, outputs: dict[str, Any] | None = None
    ) -> None:
        if exit_code is not None and (
            not isinstance(exit_code, int) or isinstance(exit_code, bool) or not 0 < exit_code <= 255
        ):
            raise ValueError(f"exit_code must be an integer in 1..255, got {exit_code!r}")
        super().__init__(message or type(self).__name__)
        #: The exit code recorded with the attempt.
        self.exit_code = self.default_exit_code if exit_code is None else exit_code
        #: Structured outputs stored with the attempt, by name (Any: JSON).
        self.outputs = dict(outputs or {})


class Retryable(TaskOutcome):
    """The attempt failed in a way that may pass on a later attempt (the retry policy applies)."""

    disposition = Disposition.RETRYABLE


class NonRetryable(TaskOutcome):
    """Trying again cannot help (configuration, contract violation, bug): dead-lettered at once."""

    disposition = Disposition.NON_RETRYABLE


class UnknownCommit(TaskOutcome):
    """The task may have committed part of its output: never retried automatically; the task
    instance waits in `needs_inspection` until an operator resolves it."""

    disposition = Disposition.UNKNOWN_COMMIT
    default_exit_code = UNKNOWN_COMMIT
