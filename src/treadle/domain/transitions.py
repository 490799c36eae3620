"""The state machine: every allowed task-instance and run transition, and the use case that makes it.

Store helpers take the states they expect from here (`task_sources`, `run_sources`), so a guarded
UPDATE can only move a row along a listed edge; tests check that nothing the engine writes
leaves the table. Pure data: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from treadle.domain.states import AttemptOutcome, RunState, TaskState


class UseCase(StrEnum):
    """What moves a row from one state to another."""

    CLAIM = "claim"
    READY = "ready"
    COMPLETE = "complete"
    FAIL = "fail"
    REAP_LOST = "reap_lost"
    REAP_TIMEOUT = "reap_timeout"
    DISPATCH_TIMEOUT = "dispatch_timeout"
    HAND_BACK = "hand_back"
    PROMOTE_RETRY = "promote_retry"
    PROPAGATE_FAILURE = "propagate_failure"
    SKIP = "skip"
    EXPAND = "expand"
    REQUEUE = "requeue"
    CLEAR = "clear"
    CANCEL = "cancel"
    CLOSE = "close"
    REOPEN = "reopen"
    RESOLVE = "resolve"
    RESCHEDULE = "reschedule"
    SENSOR_TIMEOUT = "sensor_timeout"


@dataclass(frozen=True, slots=True)
class Transition:
    """One allowed edge: `source` -> `target`, made by `by`."""

    source: str
    target: str
    by: UseCase
    why: str


_T, _R = TaskState, RunState
_RETRY_OR_DEAD = (_T.RETRY_WAIT, _T.DEAD_LETTER)
_CLEARABLE = (_T.SUCCESS, _T.DEAD_LETTER, _T.UPSTREAM_FAILED, _T.CANCELLED, _T.SKIPPED, _T.PENDING)
_ACTIVE = (_T.PENDING, _T.QUEUED, _T.RUNNING, _T.RETRY_WAIT, _T.UP_FOR_RESCHEDULE, _T.NEEDS_INSPECTION)


def _edges(
    sources: tuple[StrEnum, ...], targets: tuple[StrEnum, ...], by: UseCase, why: str
) -> list[Transition]:
    return [Transition(s.value, t.value, by, why) for s in sources for t in targets]


#: Every allowed task-instance transition. Creation (a run's roots queued, the rest pending) is
#: not a transition.
TASK_TRANSITIONS: tuple[Transition, ...] = (
    *_edges((_T.QUEUED,), (_T.RUNNING,), UseCase.CLAIM, "a worker claims it (attempt + 1, lease)"),
    *_edges(
        (_T.PENDING,),
        (_T.QUEUED,),
        UseCase.READY,
        "its trigger rule is met (by default: its last upstream succeeded)",
    ),
    *_edges((_T.RUNNING,), (_T.SUCCESS,), UseCase.COMPLETE, "the worker holding the attempt reports success"),
    *_edges((_T.RUNNING,), _RETRY_OR_DEAD, UseCase.FAIL, "the worker holding the attempt reports a failure"),
    *_edges(
        (_T.RUNNING,),
        (_T.NEEDS_INSPECTION,),
        UseCase.FAIL,
        "the attempt ended with an unknown commit (its output may be partly written)",
    ),
    *_edges(
        (_T.NEEDS_INSPECTION,),
        (_T.SUCCESS, _T.DEAD_LETTER, _T.QUEUED),
        UseCase.RESOLVE,
        "an operator inspected the output and resolved it (success, failed or requeue)",
    ),
    *_edges(
        (_T.NEEDS_INSPECTION,),
        (_T.PENDING,),
        UseCase.RESOLVE,
        "resolved as requeue, a mapped instance under max_active_mapped: held back until there is room",
    ),
    *_edges((_T.RUNNING,), _RETRY_OR_DEAD, UseCase.REAP_LOST, "its lease expired: the worker died (lost)"),
    *_edges((_T.RUNNING,), _RETRY_OR_DEAD, UseCase.REAP_TIMEOUT, "its execution deadline passed unenforced"),
    *_edges((_T.QUEUED,), _RETRY_OR_DEAD, UseCase.DISPATCH_TIMEOUT, "no worker took it before its deadline"),
    *_edges((_T.RUNNING,), (_T.QUEUED,), UseCase.HAND_BACK, "a stopping worker gives it back unstarted"),
    *_edges((_T.RETRY_WAIT,), (_T.QUEUED,), UseCase.PROMOTE_RETRY, "its retry wait is over"),
    *_edges(
        (_T.RUNNING,),
        (_T.UP_FOR_RESCHEDULE,),
        UseCase.RESCHEDULE,
        "a sensor's condition is not met yet / a submitted job still runs",
    ),
    *_edges((_T.UP_FOR_RESCHEDULE,), (_T.QUEUED,), UseCase.PROMOTE_RETRY, "its next poke is due"),
    *_edges(
        (_T.RUNNING,),
        (_T.DEAD_LETTER, _T.SKIPPED),
        UseCase.SENSOR_TIMEOUT,
        "a sensor's timeout passed (skipped when it is soft_fail)",
    ),
    *_edges(
        (_T.PENDING,),
        (_T.UPSTREAM_FAILED,),
        UseCase.PROPAGATE_FAILURE,
        "an upstream failed for good and its trigger rule can no longer be met",
    ),
    *_edges(
        (_T.PENDING,),
        (_T.SKIPPED,),
        UseCase.SKIP,
        "skips (a branch that chose other tasks, an empty list to map) left its rule unmet",
    ),
    *_edges(
        (_T.PENDING,),
        (_T.DEAD_LETTER,),
        UseCase.EXPAND,
        "the result it maps over is not a list, or is longer than its cap",
    ),
    *_edges((_T.DEAD_LETTER,), (_T.QUEUED,), UseCase.REQUEUE, "an operator requeues the dead letter"),
    *_edges((_T.UPSTREAM_FAILED,), (_T.PENDING,), UseCase.REQUEUE, "its failed upstream was requeued"),
    *_edges(
        (_T.DEAD_LETTER,),
        (_T.PENDING,),
        UseCase.REQUEUE,
        "an operator requeues a mapped task whose expansion failed (it expands again), or a mapped "
        "instance under max_active_mapped (held back until there is room)",
    ),
    *_edges(_CLEARABLE, (_T.QUEUED, _T.PENDING), UseCase.CLEAR, "an operator clears it to run again"),
    *_edges(
        (_T.SUCCESS, _T.DEAD_LETTER, _T.UPSTREAM_FAILED, _T.CANCELLED),
        (_T.SKIPPED,),
        UseCase.CLEAR,
        "a cleared mapped task folds back into one instance; the others are retired",
    ),
    *_edges(_ACTIVE, (_T.CANCELLED,), UseCase.CANCEL, "an operator cancels it or its run"),
)

#: Every allowed run transition. Runs are created running.
RUN_TRANSITIONS: tuple[Transition, ...] = (
    *_edges((_R.RUNNING,), (_R.SUCCESS, _R.FAILED), UseCase.CLOSE, "no task instance is active any more"),
    *_edges((_R.QUEUED, _R.RUNNING), (_R.CANCELLED,), UseCase.CANCEL, "an operator cancels the run"),
    *_edges((_R.SUCCESS, _R.FAILED), (_R.RUNNING,), UseCase.REOPEN, "a requeue or clear made a task active"),
    *_edges((_R.CANCELLED,), (_R.RUNNING,), UseCase.REOPEN, "an operator clears a task of a cancelled run"),
)


class TransitionNotAllowed(ValueError):
    """A use case asked for an edge the state machine does not have (a programming error)."""


def _sources(table: tuple[Transition, ...], by: UseCase, target: str) -> tuple[str, ...]:
    found = tuple(sorted({t.source for t in table if t.by is by and t.target == target}))
    if not found:
        raise TransitionNotAllowed(f"{by.value} never moves anything to {target!r}")
    return found


def task_sources(by: UseCase, target: TaskState) -> tuple[str, ...]:
    """The task-instance states `by` may move to `target` (what a guarded UPDATE expects)."""
    return _sources(TASK_TRANSITIONS, by, target.value)


def run_sources(by: UseCase, target: RunState) -> tuple[str, ...]:
    """The run states `by` may move to `target`."""
    return _sources(RUN_TRANSITIONS, by, target.value)


def task_edges() -> frozenset[tuple[str, str]]:
    """Every allowed (from, to) pair of task-instance states."""
    return frozenset((t.source, t.target) for t in TASK_TRANSITIONS)


def run_edges() -> frozenset[tuple[str, str]]:
    """Every allowed (from, to) pair of run states."""
    return frozenset((t.source, t.target) for t in RUN_TRANSITIONS)


def markdown_table() -> str:
    """The transition tables as markdown (docs/architecture.md holds this text, checked by a test)."""
    lines = []
    for title, table in (("Task instance", TASK_TRANSITIONS), ("Run", RUN_TRANSITIONS)):
        lines += [f"**{title} transitions**", "", "| from | to | use case | when |", "|---|---|---|---|"]
        lines += [f"| {t.source} | {t.target} | {t.by.value} | {t.why} |" for t in table]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def ending_use_case(outcome: AttemptOutcome, *, reported: bool) -> UseCase:
    """Who ends a running attempt that did not succeed: its worker's report, or the reaper."""
    if reported:
        return UseCase.FAIL
    return UseCase.REAP_LOST if outcome is AttemptOutcome.LOST else UseCase.REAP_TIMEOUT
