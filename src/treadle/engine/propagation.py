"""What follows the end of a task instance: its direct downstream rows count it, and their trigger
rules say whether they run, wait, are skipped or fail upstream.

The default case stays on the hot path (execution.py): a success on a downstream row of a plain
task (rule `all_success`, not mapped) adds to its counter in one UPDATE for the whole batch,
which queues the rows it fills. Everything else comes here, one waiting row at a time, with
its counters read back under the row lock: a failed or skipped upstream, a branch that did
not choose a task, a task with another rule, a mapped task (whose readiness expands it,
engine/mapping.py), and the held-back instances of a mapped task with `max_active_mapped`.
Nothing here reads more than the direct upstreams of the rows it decides.

Reopeners (requeue, clear) call `settle`: the rows they reopened, and the waiting rows right
after them, have their counters recomputed from their upstreams' states and their rule applied
again, in dependency order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion, TaskDef
from treadle.domain.graph import topological_order
from treadle.domain.states import TaskState
from treadle.domain.task_records import ClaimedTask
from treadle.domain.transitions import UseCase
from treadle.domain.trigger_rules import (
    DEFAULT_RULE,
    End,
    TriggerRule,
    UpstreamCounts,
    Verdict,
    end_of,
    evaluate,
)
from treadle.engine import mapping
from treadle.engine.versions import version_of
from treadle.store import attempts as attempt_store
from treadle.store import dialects
from treadle.store import readiness as readiness_store
from treadle.store.database import Database


@dataclass(frozen=True, slots=True)
class Arrival:
    """`n` ends of one kind reaching the waiting row of a downstream task."""

    version_id: int
    run_id: str
    task_id: str
    end: End
    n: int = 1
    #: A branch did not choose the task: it is skipped whatever its rule (as in Airflow).
    unchosen: bool = False


@dataclass(frozen=True, slots=True)
class Release:
    """The end of an instance of a mapped task with `max_active_mapped`: held-back siblings go,
    up to the bound (engine/mapping.release_held_back)."""

    run_id: str
    task_id: str
    max_active: int


FollowUp = Arrival | Release


@dataclass(slots=True)
class Readied:
    """What a delivery queued: the queues (for NOTIFY) and the runs it made active."""

    queues: set[str] = field(default_factory=set)
    runs: set[str] = field(default_factory=set)

    def add(self, run_id: str, queues: Iterable[str]) -> None:
        """Record queued rows of a run."""
        listed = list(queues)
        if listed:
            self.queues.update(listed)
            self.runs.add(run_id)


def is_plain(definition: TaskDef) -> bool:
    """True for a task the hot path readies by counter alone: rule all_success, not mapped."""
    return definition.trigger_rule == DEFAULT_RULE.value and definition.map_arg is None


def after_success(version: DagVersion, task: ClaimedTask, value: Any) -> tuple[list[str], list[FollowUp]]:
    """Split what a success leads to: the plain downstream tasks whose counters the hot path
    adds to, and the follow-ups `deliver` applies (`value`: the result, a branch's choice)."""
    tasks = version.structure.tasks
    definition = tasks[task.task_id]
    chosen = set(value) if definition.branch and isinstance(value, list) else None
    plain: list[str] = []
    more: list[FollowUp] = []
    for d in version.downstream[task.task_id]:
        if chosen is not None and d not in chosen:
            more.append(Arrival(version.id, task.run_id, d, End.SKIPPED, unchosen=True))
        elif is_plain(tasks[d]):
            plain.append(d)
        else:
            more.append(Arrival(version.id, task.run_id, d, End.SUCCESS))
    more.extend(_releases(definition, task))
    return plain, more


def _releases(definition: TaskDef, task: ClaimedTask) -> list[FollowUp]:
    return releases_after(definition, task.run_id, task.map_index)


def releases_after(definition: TaskDef, run_id: str, map_index: int) -> list[FollowUp]:
    """What the end of instance `map_index` of this task lets go: nothing unless it is a mapped
    instance whose task has `max_active_mapped`."""
    if definition.max_active_mapped is None or map_index < 0:
        return []
    return [Release(run_id, definition.task_id, definition.max_active_mapped)]


def after_dead_letter(db: Database, conn: Connection, task: ClaimedTask, *, now: datetime | None) -> None:
    """A task instance ended dead_letter: its downstream rows count a failure (and their rules
    decide), and a held-back sibling of a mapped instance may start. NOTIFY if anything queued."""
    version = version_of(db, conn, task.dag_version_id)
    follow: list[FollowUp] = [
        Arrival(version.id, task.run_id, d, End.FAILED) for d in version.downstream[task.task_id]
    ]
    follow.extend(_releases(version.structure.tasks[task.task_id], task))
    if deliver(db, conn, follow, now=now).queues:
        dialects.notify_ready(conn)


def deliver(
    db: Database, conn: Connection, follow_ups: Sequence[FollowUp], *, now: datetime | None
) -> Readied:
    """Apply follow-ups in the caller's transaction, and the ends they cause in turn (a skip or an
    upstream failure travels on through the rules of the rows it reaches).

    Releases come last, one per mapped task, by run: each locks its run row, and every
    task-instance write of the arrivals comes before (instances first, then the run).
    """
    readied = Readied()
    grouped: dict[tuple[int, str, str, End, bool], int] = {}
    releases: dict[tuple[str, str], int] = {}
    for f in follow_ups:
        if isinstance(f, Arrival):
            key = (f.version_id, f.run_id, f.task_id, f.end, f.unchosen)
            grouped[key] = grouped.get(key, 0) + f.n
        else:
            releases[(f.run_id, f.task_id)] = f.max_active
    work = deque(Arrival(v, r, t, e, n, unchosen=u) for (v, r, t, e, u), n in sorted(grouped.items()))
    while work:
        item = work.popleft()
        row = readiness_store.count_end(
            conn, run_id=item.run_id, task_id=item.task_id, end=item.end, n=item.n
        )
        if row is None:
            continue
        version = version_of(db, conn, item.version_id)
        verdict = Verdict.SKIP if item.unchosen else evaluate(_rule(version, item.task_id), row.counts)
        work.extend(_apply(db, conn, version, item.run_id, item.task_id, row.id, verdict, now, readied))
    for (run_id, task_id), max_active in sorted(releases.items()):
        queues = mapping.release_held_back(
            conn, run_id=run_id, task_id=task_id, max_active=max_active, now=now
        )
        readied.add(run_id, queues)
    return readied


def _rule(version: DagVersion, task_id: str) -> TriggerRule:
    return TriggerRule(version.structure.tasks[task_id].trigger_rule)


def _apply(
    db: Database,
    conn: Connection,
    version: DagVersion,
    run_id: str,
    task_id: str,
    row_id: int,
    verdict: Verdict,
    now: datetime | None,
    readied: Readied,
) -> list[Arrival]:
    """Carry out a verdict on a waiting row; returns the ends it sends downstream."""
    if verdict is Verdict.WAIT:
        return []
    if verdict is Verdict.READY:
        if version.structure.tasks[task_id].map_arg is None:
            readied.add(run_id, readiness_store.ready(conn, [row_id], now=now))
            return []
        expansion = mapping.expand(db, conn, version, run_id=run_id, task_id=task_id, row_id=row_id)
        readied.add(run_id, expansion.queues)
        end = expansion.ended
    else:
        skip = verdict is Verdict.SKIP
        state = TaskState.SKIPPED if skip else TaskState.UPSTREAM_FAILED
        by = UseCase.SKIP if skip else UseCase.PROPAGATE_FAILURE
        readiness_store.end_waiting(conn, [row_id], state=state, by=by, now=now)
        end = End.SKIPPED if skip else End.FAILED
    if end is None:
        return []
    return [Arrival(version.id, run_id, d, end) for d in version.downstream[task_id]]


@dataclass(frozen=True, slots=True)
class UpstreamView:
    """How a task's direct upstream instances stand, and whether a branch skipped the task."""

    counts: UpstreamCounts
    unchosen: bool

    def verdict(self, rule: TriggerRule) -> Verdict:
        """The rule's verdict; a task a branch did not choose is skipped whatever its rule."""
        return Verdict.SKIP if self.unchosen else evaluate(rule, self.counts)


def upstream_view(conn: Connection, version: DagVersion, run_id: str, task_id: str) -> UpstreamView:
    """How the direct upstream instances of a task ended, read from their rows (a branch that
    succeeded without choosing the task skips it). Cost: its fan-in."""
    ups = version.structure.upstream_map()[task_id]
    instances = readiness_store.instances_of(conn, run_id=run_id, task_ids=ups)
    chosen = branch_choices(conn, version, run_id, instances)
    unchosen = any(task_id not in picked for picked in chosen.values())
    counts = UpstreamCounts.of(end_of(i.state) for i in instances)
    return UpstreamView(counts=counts, unchosen=unchosen)


class _Stated(Protocol):
    @property
    def task_id(self) -> str: ...
    @property
    def state(self) -> str: ...


def branch_choices(
    conn: Connection, version: DagVersion, run_id: str, instances: Iterable[_Stated]
) -> dict[str, set[str]]:
    """The tasks each succeeded branch task among `instances` chose (its stored result)."""
    tasks = version.structure.tasks
    done = sorted(
        {i.task_id for i in instances if tasks[i.task_id].branch and i.state == TaskState.SUCCESS.value}
    )
    values = attempt_store.get_results(conn, [(run_id, b) for b in done])
    return {b: set(v) if isinstance(v := values.get((run_id, b)), list) else set() for b in done}


def settle(
    db: Database,
    conn: Connection,
    version: DagVersion,
    run_id: str,
    task_ids: Iterable[str],
    *,
    now: datetime,
) -> Readied:
    """Recount and decide again the waiting rows of these tasks and of the tasks right after
    them, in dependency order (after a requeue or clear reopened some of them).

    Each waiting row gets counters that match its upstreams' states now, then its rule is
    applied; an end it causes reaches rows outside the set as an ordinary delivery.
    """
    region = set(task_ids)
    region.update(d for t in list(region) for d in version.downstream[t])
    readied = Readied()
    follow: list[FollowUp] = []
    waiting = _waiting_rows(conn, run_id, region)
    for task_id in topological_order(version.structure.upstream_map()):
        row_id = waiting.get(task_id)
        if row_id is None:
            continue
        view = upstream_view(conn, version, run_id, task_id)
        if not readiness_store.set_waiting_counts(conn, [(row_id, view.counts)]):
            continue
        verdict = view.verdict(_rule(version, task_id))
        ends = _apply(db, conn, version, run_id, task_id, row_id, verdict, now, readied)
        follow.extend(a for a in ends if a.task_id not in region)
    more = deliver(db, conn, follow, now=now)
    readied.queues |= more.queues
    readied.runs |= more.runs
    return readied


def _waiting_rows(conn: Connection, run_id: str, task_ids: set[str]) -> dict[str, int]:
    return {
        i.task_id: i.id
        for i in readiness_store.instances_of(conn, run_id=run_id, task_ids=task_ids)
        if i.map_index == -1 and i.state == TaskState.PENDING.value
    }
