"""Plain values of task instances, attempts and workers that the store returns and the engine,
CLI and worker pass around (those of DAGs and runs are in records.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskInstanceInfo:
    """One task instance row."""

    id: int
    run_id: str
    dag_id: str
    task_id: str
    #: Position of a mapped instance in the list it maps over; -1 for a task that is not mapped.
    map_index: int = -1
    state: str
    attempt: int
    budget_base: int
    orphaned_count: int
    queue: str
    queued_at: datetime | None
    next_attempt_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    worker_id: str | None
    hostname: str | None
    lease_expires_at: datetime | None
    dead_letter_reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptInfo:
    """One recorded attempt (history is append-only)."""

    task_instance_id: int
    run_id: str
    task_id: str
    attempt: int
    outcome: str
    error_type: str | None
    error_message: str | None
    traceback: str | None
    fingerprint: str | None
    worker_id: str | None
    hostname: str | None
    started_at: datetime | None
    ended_at: datetime
    duration_s: float | None
    retry_delay_s: float | None
    late_result: str | None
    #: Exit code of the program, or the code a Python task's exception stands for.
    exit_code: int | None = None
    #: sha256 of the DAG file that ran.
    code_version: str | None = None
    #: Structured outputs the attempt left, by name (Any: JSON).
    outputs: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedTask:
    """What a worker needs to run one claimed attempt."""

    task_instance_id: int
    run_id: str
    dag_id: str
    task_id: str
    attempt: int
    budget_base: int
    orphaned_count: int
    dag_version_id: int
    logical_date: datetime
    #: None while the attempt waits in a worker's buffer (claimed, not started).
    started_at: datetime | None
    timeout_s: float | None
    #: The run's params (validated, defaults applied). Any: user JSON.
    conf: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)  # Any: JSON
    upstream_results: dict[str, Any] = field(default_factory=dict)  # Any: user JSON
    #: A mapped instance's position, and the element of the mapped list it runs with.
    map_index: int = -1
    map_item: Any = None  # Any: user JSON
    #: Database time of the claim (None: not read from a claim), and the poke columns the claim
    #: read with it: a poke starts from them without another query (`engine.sensing`).
    claimed_at: datetime | None = None
    first_poke_at: datetime | None = None
    poll_state: Any = None  # Any: JSON
    #: When the task instance became ready (database time), as the claim read it.
    queued_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRow:
    """One attempt as the store reads it: claimed, or the reaper's evidence about it.

    The first fields identify the attempt and its retry budget; the rest are filled by the
    queries that select them (None otherwise).
    """

    id: int
    run_id: str
    dag_id: str
    task_id: str
    attempt: int
    budget_base: int
    orphaned_count: int
    map_index: int = -1
    started_at: datetime | None = None
    timeout_s: float | None = None
    worker_id: str | None = None
    hostname: str | None = None
    lease_expires_at: datetime | None = None
    heartbeat_at: datetime | None = None
    timeout_at: datetime | None = None
    queue: str = "default"
    pool: str | None = None
    pool_slots: int = 1
    queued_at: datetime | None = None
    dispatch_deadline: datetime | None = None
    #: A sensor's or submit-then-poll task's first poke and the state its last poke left.
    first_poke_at: datetime | None = None
    poll_handle: Any = None  # Any: JSON


@dataclass(frozen=True, slots=True, kw_only=True)
class ActiveInstance:
    """An active task instance of a run, as a cancel reads it (locked)."""

    id: int
    task_id: str
    state: str
    attempt: int
    worker_id: str | None
    hostname: str | None
    started_at: datetime | None
    map_index: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueFacts:
    """What admission of one task instance depends on."""

    queue: str
    pool: str | None
    pool_slots: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptError:
    """Why an attempt did not succeed (bounded text)."""

    error_type: str
    message: str
    traceback: str = ""
    frame: str = ""
    retryable: bool = True
    #: The job may have committed part of its output: the instance waits for an operator.
    unknown_commit: bool = False
    #: The program's exit code (or the code a Python task's exception stands for).
    exit_code: int | None = None
    #: sha256 of the DAG file that ran (None when the attempt never reached user code).
    code_version: str | None = None
    #: Structured outputs the attempt left before failing (Any: JSON), by name.
    outputs: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptDetails:
    """What a successful attempt reports besides its result."""

    exit_code: int | None = None
    code_version: str | None = None
    #: Structured outputs by name (Any: JSON).
    outputs: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerInfo:
    """A worker process as it last reported itself."""

    worker_id: str
    hostname: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    state: str
    started_at: datetime
    last_heartbeat_at: datetime
    #: Attempts claimed ahead of a free slot, at most.
    prefetch: int = 0
    #: Attempts running in a child process at the last heartbeat.
    active: int = 0
    #: Attempts claimed and waiting for a slot at the last heartbeat.
    prefetched: int = 0
