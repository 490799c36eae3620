"""Planning a clear: which finished task instances of a run go back to queued or pending, and how.

Pure: it takes the run's DAG version and the instances' states (read under lock by the engine)
and returns the writes to make, or refuses with a message that names the problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treadle.domain.dag_version import DagVersion
from treadle.domain.graph import topological_order
from treadle.domain.states import TaskState
from treadle.domain.transitions import UseCase, task_sources
from treadle.errors import InvalidRequest

#: States a task instance may be cleared from (the state machine's clear edges).
CLEARABLE_STATES = frozenset(task_sources(UseCase.CLEAR, TaskState.QUEUED))
#: Upstream states that keep a task from ever becoming ready.
_BLOCKING = frozenset(
    s.value
    for s in (TaskState.DEAD_LETTER, TaskState.UPSTREAM_FAILED, TaskState.CANCELLED, TaskState.SKIPPED)
)
#: Ended states that `only_failed` leaves alone.
_GOOD = frozenset({TaskState.SUCCESS.value, TaskState.SKIPPED.value})


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceState:
    """What a clear reads of one task instance (under a row lock)."""

    id: int
    task_id: str
    map_index: int
    state: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Reset:
    """One task instance to put back: from `expected` (at `attempt`) to queued or pending."""

    id: int
    expected: str
    attempt: int
    queued: bool
    upstream_done: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearPlan:
    """The writes of a clear: resets in dependency order, and pending counters to recompute."""

    order: list[str]
    resets: list[Reset]
    #: (task instance id, succeeded upstreams) of pending instances left out of the clear.
    recounts: list[tuple[int, int]]

    @property
    def queues_any(self) -> bool:
        """True if a cleared instance becomes queued (workers are to be woken)."""
        return any(r.queued for r in self.resets)


def plan_clear(
    version: DagVersion,
    run_id: str,
    instances: Sequence[InstanceState],
    *,
    task_ids: Sequence[str] | None,
    downstream: bool,
    only_failed: bool,
) -> ClearPlan:
    """Plan clearing task instances of a run (see engine/clearing.py for the options).

    Raises InvalidRequest for an empty or unknown task list, an instance that is still active,
    or a task that could never run because an upstream left out of the clear failed.
    """
    tasks = version.structure.tasks
    if task_ids is not None:
        if not task_ids:
            raise InvalidRequest("name at least one task to clear")
        unknown = sorted(set(task_ids) - set(tasks))
        if unknown:
            raise InvalidRequest(f"run {run_id!r} has no task {', '.join(map(repr, unknown))}")
    states = {i.task_id: i.state for i in instances}
    named = set(tasks) if task_ids is None else set(task_ids)
    if only_failed:
        named = {t for t in named if states.get(t) not in _GOOD}
    targets = set(named)
    if downstream:
        for task_id in named:
            targets.update(version.all_downstream(task_id))
    targets &= set(states)
    if not targets:
        return ClearPlan(order=[], resets=[], recounts=[])
    _refuse_active(run_id, targets, states)
    order = [t for t in topological_order(version.structure.upstream_map()) if t in targets]
    return ClearPlan(
        order=order,
        resets=_resets(version, order, states, instances),
        recounts=_recounts(version, targets, states, instances),
    )


def _refuse_active(run_id: str, targets: set[str], states: dict[str, str]) -> None:
    """InvalidRequest naming every target instance that has not finished."""
    active = sorted(t for t in targets if states[t] not in CLEARABLE_STATES)
    if active:
        listed = ", ".join(f"{t} ({states[t]})" for t in active)
        inspect = [t for t in active if states[t] == "needs_inspection"]
        hint = (
            f"; a task in needs_inspection is resolved with `treadle tasks resolve {run_id} {inspect[0]} "
            "--as success|failed|requeue --reason ...`"
            if inspect
            else ""
        )
        raise InvalidRequest(
            f"cannot clear task(s) of run {run_id!r} that have not finished: {listed}; "
            f"wait for them to end or cancel them first{hint}"
        )


def _recounts(
    version: DagVersion, targets: set[str], states: dict[str, str], instances: Sequence[InstanceState]
) -> list[tuple[int, int]]:
    """Upstream counters of pending instances left out of the clear that follow a cleared task.

    Their counter may count a cleared upstream's earlier success; it would be counted again
    when that upstream succeeds anew, readying them too early.
    """
    upstream = version.structure.upstream_map()
    counts = []
    for inst in instances:
        ups = upstream.get(inst.task_id, ())
        if inst.task_id in targets or states[inst.task_id] != TaskState.PENDING.value:
            continue
        if any(u in targets for u in ups):
            done = sum(1 for u in ups if u not in targets and states.get(u) == TaskState.SUCCESS.value)
            counts.append((inst.id, done))
    return counts


def _resets(
    version: DagVersion, order: list[str], states: dict[str, str], instances: Sequence[InstanceState]
) -> list[Reset]:
    """The resets of the targets, in dependency order."""
    upstream = version.structure.upstream_map()
    final = dict(states)
    by_task = {i.task_id: i for i in instances}
    resets: list[Reset] = []
    targets = set(order)
    for task_id in order:
        ups = upstream[task_id]
        blocked = sorted(u for u in ups if u not in targets and final.get(u) in _BLOCKING)
        if blocked:
            listed = ", ".join(f"{u} ({final[u]})" for u in blocked)
            raise InvalidRequest(
                f"task {task_id!r} could never run: its upstream {listed} is not being cleared; "
                "clear that upstream too (with --downstream to include what follows it)"
            )
        done = sum(1 for u in ups if final.get(u) == TaskState.SUCCESS.value)
        queued = done == len(ups)
        final[task_id] = (TaskState.QUEUED if queued else TaskState.PENDING).value
        inst = by_task[task_id]
        resets.append(
            Reset(id=inst.id, expected=inst.state, attempt=inst.attempt, queued=queued, upstream_done=done)
        )
    return resets
