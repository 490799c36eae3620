"""States of task instances and runs, and outcomes of attempts (closed sets)."""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    """State of one task instance in one run."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    #: A sensor whose condition did not hold yet, or a submitted job still running: waits for
    #: its next poke in the database, holding no worker slot.
    UP_FOR_RESCHEDULE = "up_for_reschedule"
    #: The attempt may have committed part of its output (unknown commit): never retried
    #: automatically; blocks its downstream and holds the run open until an operator resolves it.
    NEEDS_INSPECTION = "needs_inspection"
    SUCCESS = "success"
    DEAD_LETTER = "dead_letter"
    UPSTREAM_FAILED = "upstream_failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


TERMINAL_TASK_STATES: frozenset[TaskState] = frozenset(
    {
        TaskState.SUCCESS,
        TaskState.DEAD_LETTER,
        TaskState.UPSTREAM_FAILED,
        TaskState.SKIPPED,
        TaskState.CANCELLED,
    }
)
ACTIVE_TASK_STATES: frozenset[TaskState] = frozenset(TaskState) - TERMINAL_TASK_STATES


class RunState(StrEnum):
    """State of a DAG run."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_RUN_STATES: frozenset[RunState] = frozenset({RunState.SUCCESS, RunState.FAILED, RunState.CANCELLED})


class RunType(StrEnum):
    """What created a run."""

    MANUAL = "manual"
    SCHEDULED = "scheduled"
    BACKFILL = "backfill"
    DATASET = "dataset"


class AttemptOutcome(StrEnum):
    """How one attempt ended."""

    SUCCESS = "success"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"
    DISPATCH_TIMEOUT = "dispatch_timeout"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    #: The job may have committed part of its output (exit code 60 by the standard contract).
    UNKNOWN_COMMIT = "unknown_commit"
    #: A poke found the condition not met yet (or the submitted job still running): the instance
    #: waits for its next poke; spends no retry.
    RESCHEDULED = "rescheduled"


class DeadLetterReason(StrEnum):
    """Why a task instance was dead-lettered."""

    RETRIES_EXHAUSTED = "retries_exhausted"
    POISON = "poison"
    NON_RETRYABLE = "non_retryable"
    #: An operator resolved a needs_inspection instance as failed.
    RESOLVED_FAILED = "resolved_failed"
    #: A sensor's condition (or a submitted job) did not complete within its timeout.
    SENSOR_TIMEOUT = "sensor_timeout"
