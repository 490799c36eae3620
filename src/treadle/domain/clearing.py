"""Planning a clear: which finished task instances of a run go back to run again, and how.

Pure: it takes the run's DAG version, the instances' states (read under lock by the engine) and
the choices of the run's branch tasks, and returns the writes to make, or refuses with a message
that names the problem. A cleared task is queued when its trigger rule is met by its upstreams
as they will stand, else it goes back to pending (the engine then recounts its upstreams). A
mapped task clears its instances one by one, each queued again with its element, unless one of
its upstreams is cleared too: then it folds back into one waiting row and expands again from the
new list (its other instances are retired)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from treadle.domain.dag_version import DagVersion
from treadle.domain.graph import topological_order
from treadle.domain.states import TaskState
from treadle.domain.transitions import UseCase, task_sources
from treadle.domain.trigger_rules import End, TriggerRule, UpstreamCounts, Verdict, end_of, evaluate
from treadle.errors import InvalidRequest

#: States a task instance may be cleared from (the state machine's clear edges).
CLEARABLE_STATES = frozenset(task_sources(UseCase.CLEAR, TaskState.QUEUED))
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
    #: The map index it takes (-1: a mapped task folded back into its waiting row); None keeps it.
    map_index: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearPlan:
    """The writes of a clear: resets in dependency order, and mapped instances to retire."""

    order: list[str]
    resets: list[Reset]
    retires: list[int]

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
    branch_choices: Mapping[str, set[str]] | None = None,
) -> ClearPlan:
    """Plan clearing task instances of a run (see engine/clearing.py for the options).

    `branch_choices`: the tasks each succeeded branch task of the run chose. Raises
    InvalidRequest for an empty or unknown task list, an instance that is still active, or a
    task whose trigger rule could never be met because an upstream left out of the clear failed
    or was skipped.
    """
    tasks = version.structure.tasks
    if task_ids is not None:
        if not task_ids:
            raise InvalidRequest("name at least one task to clear")
        unknown = sorted(set(task_ids) - set(tasks))
        if unknown:
            raise InvalidRequest(f"run {run_id!r} has no task {', '.join(map(repr, unknown))}")
    live: dict[str, list[InstanceState]] = {}
    for i in sorted(instances, key=lambda i: (i.task_id, i.map_index)):
        if i.map_index >= -1:
            live.setdefault(i.task_id, []).append(i)
    named = set(tasks) if task_ids is None else set(task_ids)
    chosen = {t: list(live.get(t, [])) for t in named}
    if only_failed:
        chosen = {t: [i for i in found if i.state not in _GOOD] for t, found in chosen.items()}
    named = {t for t, found in chosen.items() if found}
    targets = set(named)
    if downstream:
        for task_id in named:
            targets.update(version.all_downstream(task_id))
    targets &= set(live)
    if not targets:
        return ClearPlan(order=[], resets=[], retires=[])
    selected = {t: chosen[t] if t in chosen else live[t] for t in targets}
    _refuse_active(run_id, selected)
    order = [t for t in topological_order(version.structure.upstream_map()) if t in targets]
    planner = _Planner(version, live, branch_choices or {})
    for task_id in order:
        planner.clear(task_id, selected[task_id], targets)
    return ClearPlan(order=order, resets=planner.resets, retires=planner.retires)


def _label(i: InstanceState) -> str:
    return i.task_id if i.map_index < 0 else f"{i.task_id}[{i.map_index}]"


def _refuse_active(run_id: str, selected: Mapping[str, list[InstanceState]]) -> None:
    """InvalidRequest naming every target instance that has not finished."""
    # A held-back mapped instance (pending) waits for a sibling: its task is still running.
    active = sorted(
        (
            i
            for found in selected.values()
            for i in found
            if i.state not in CLEARABLE_STATES or (i.map_index >= 0 and i.state == TaskState.PENDING.value)
        ),
        key=lambda i: (i.task_id, i.map_index),
    )
    if active:
        listed = ", ".join(f"{_label(i)} ({i.state})" for i in active)
        inspect = [i for i in active if i.state == "needs_inspection"]
        hint = (
            f"; a task in needs_inspection is resolved with `treadle tasks resolve {run_id} "
            f"{inspect[0].task_id} --as success|failed|requeue --reason ...`"
            if inspect
            else ""
        )
        raise InvalidRequest(
            f"cannot clear task(s) of run {run_id!r} that have not finished: {listed}; "
            f"wait for them to end or cancel them first{hint}"
        )


class _Planner:
    """Walks the targets in dependency order, keeping how each task's instances will stand."""

    def __init__(
        self, version: DagVersion, live: dict[str, list[InstanceState]], choices: Mapping[str, set[str]]
    ) -> None:
        self.tasks = version.structure.tasks
        self.upstream = version.structure.upstream_map()
        self.choices = choices
        #: How each task's instances will have ended (None: not ended) once the clear is applied.
        self.ends: dict[str, list[End | None]] = {
            t: [end_of(i.state) for i in found] for t, found in live.items()
        }
        self.live = live
        self.resets: list[Reset] = []
        self.retires: list[int] = []

    def clear(self, task_id: str, selected: list[InstanceState], targets: set[str]) -> None:
        """Plan the writes of one target task (its upstream targets are planned already)."""
        found = self.live[task_id]
        definition = self.tasks[task_id]
        folds = definition.map_arg is not None and (
            any(u in targets for u in self.upstream[task_id]) or all(i.map_index < 0 for i in found)
        )
        if definition.map_arg is not None and not folds:
            # Under max_active_mapped a cleared instance is held back: the engine lets it go
            # when its siblings leave room (engine/mapping.release_held_back).
            paced = definition.max_active_mapped is not None
            self.resets.extend(
                Reset(id=i.id, expected=i.state, attempt=i.attempt, queued=not paced) for i in selected
            )
            picked = {i.id for i in selected}
            self.ends[task_id] = [None if i.id in picked else end_of(i.state) for i in found]
            return
        verdict = self._verdict(task_id)
        keeper, *others = found
        self.resets.append(
            Reset(
                id=keeper.id,
                expected=keeper.state,
                attempt=keeper.attempt,
                # Ready now: queued at once (a mapped task waits to be expanded by the engine).
                queued=verdict is Verdict.READY and definition.map_arg is None,
                map_index=-1 if keeper.map_index >= 0 else None,
            )
        )
        self.retires.extend(i.id for i in others)
        self.ends[task_id] = [None]

    def _verdict(self, task_id: str) -> Verdict:
        """The task's rule on its upstreams as they will stand; InvalidRequest if it could never
        be met (an upstream left out of the clear failed, was skipped, or chose other tasks)."""
        listed: list[End | None] = []
        blockers = []
        for u in self.upstream[task_id]:
            picked = self.choices.get(u)
            ends = self.ends.get(u, [])
            if picked is not None and task_id not in picked and None not in ends:
                # A branch skips the tasks it did not choose, whatever their rule.
                raise InvalidRequest(
                    f"task {task_id!r} could never run: its upstream {u} (a branch that chose other "
                    "tasks) is not being cleared; clear that upstream too (with --downstream to "
                    "include what follows it)"
                )
            listed.extend(ends)
            bad = [_label(i) + f" ({i.state})" for i in self.live.get(u, []) if end_of(i.state) in _BLOCKING]
            if bad and None not in ends:
                blockers.extend(bad)
        verdict = evaluate(TriggerRule(self.tasks[task_id].trigger_rule), UpstreamCounts.of(listed))
        if verdict in (Verdict.SKIP, Verdict.UPSTREAM_FAILED):
            raise InvalidRequest(
                f"task {task_id!r} could never run: its upstream {', '.join(blockers)} is not being "
                "cleared; clear that upstream too (with --downstream to include what follows it)"
            )
        return verdict


_BLOCKING = frozenset({End.FAILED, End.SKIPPED})
