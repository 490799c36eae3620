"""Dynamic task mapping: a mapped task expands into one instance per element of an upstream's list
when its trigger rule is met, and its downstream gets the instances' results as one list.

A mapped task has one waiting row (map index -1) until then. Its expansion, in the transaction
that readies it, turns that row into instance 0 and inserts instances 1..n-1 with their elements
(`task_map_items`); direct downstream rows count n upstream instances from then on, so the hot
path counts each instance's success like any other. An empty list skips the task; a result that
is not a list, or is longer than the cap, dead-letters it (`non_retryable`) with an attempt that
says why. With `max_active_mapped=N` the first N are queued and the others are held back
(pending); the end of an instance, and a requeue or clear of one (which holds it back as well),
queues held-back instances in map-index order while fewer than N hold a place
(`release_held_back`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion, TaskDef
from treadle.domain.fingerprint import fingerprint
from treadle.domain.mapping import MapFailure, check_expansion, first_active
from treadle.domain.states import AttemptOutcome, DeadLetterReason, TaskState
from treadle.domain.task_records import AttemptRow
from treadle.domain.transitions import UseCase
from treadle.domain.trigger_rules import End, end_of
from treadle.engine.versions import version_of
from treadle.store import attempts as attempt_store
from treadle.store import mapping as mapping_store
from treadle.store import readiness as readiness_store
from treadle.store import runs as run_store
from treadle.store.database import Database, db_now


@dataclass(frozen=True, slots=True, kw_only=True)
class Expansion:
    """What readying a mapped task did: the queues of instances queued, or how the task ended
    without instances (sent on to its downstream), or neither (its list is not there yet)."""

    queues: list[str]
    ended: End | None = None


def expand(
    db: Database, conn: Connection, version: DagVersion, *, run_id: str, task_id: str, row_id: int
) -> Expansion:
    """Expand the waiting row of a mapped task whose trigger rule is met, in the caller's
    transaction (its list is read from the source task's result).

    A source that did not succeed ends the task as its rule would have: upstream_failed after a
    failure, skipped after a skip. A source still running (a rule such as one_success fired on
    another upstream) leaves the row waiting: the source's end decides it again.
    """
    definition = version.structure.tasks[task_id]
    source = definition.map_source
    assert source is not None
    sources = readiness_store.instances_of(conn, run_id=run_id, task_ids=[source])
    ends = [end_of(i.state) for i in sources]
    if None in ends:
        return Expansion(queues=[])
    now = db_now(conn)
    if End.FAILED in ends or End.SKIPPED in ends:
        failed = End.FAILED in ends
        state = TaskState.UPSTREAM_FAILED if failed else TaskState.SKIPPED
        by = UseCase.PROPAGATE_FAILURE if failed else UseCase.SKIP
        readiness_store.end_waiting(conn, [row_id], state=state, by=by, now=now)
        return Expansion(queues=[], ended=End.FAILED if failed else End.SKIPPED)
    checked = check_expansion(
        task_id,
        source,
        _source_value(conn, version, run_id, source),
        task_cap=definition.max_map_length,
        deployment_cap=db.max_map_length,
    )
    if isinstance(checked, MapFailure):
        _fail(conn, version, run_id=run_id, task_id=task_id, row_id=row_id, failure=checked, now=now)
        return Expansion(queues=[], ended=End.FAILED)
    if not checked:
        readiness_store.end_waiting(conn, [row_id], state=TaskState.SKIPPED, by=UseCase.SKIP, now=now)
        return Expansion(queues=[], ended=End.SKIPPED)
    template = mapping_store.waiting_row(conn, row_id)
    active = first_active(len(checked), definition.max_active_mapped)
    if not mapping_store.expand(
        conn, row_id=row_id, template=template, length=len(checked), active=active, now=now
    ):
        return Expansion(queues=[])
    mapping_store.copy_elements(
        conn,
        run_id=run_id,
        task_id=task_id,
        source=source,
        source_mapped=version.structure.tasks[source].map_arg is not None,
    )
    mapping_store.add_to_totals(
        conn, run_id=run_id, task_ids=version.downstream[task_id], delta=len(checked) - 1
    )
    return Expansion(queues=[template["queue"]])


def release_held_back(
    conn: Connection, *, run_id: str, task_id: str, max_active: int, now: datetime | None
) -> list[str]:
    """Queue held-back instances of a mapped task, lowest map index first, while fewer than
    `max_active` of its instances hold a place (queued up to needs_inspection); their queues.

    Every party that changes how many hold a place or which wait (an instance's end, a requeue,
    a clear, a resolution) calls this after its task-instance writes, in its transaction. The
    decision is made under the run row's lock, from reads made once the lock is held: whoever
    decides second sees what the first committed (an end, a requeued instance waiting), so
    concurrent ends and requeues neither pass the bound nor leave an instance held back with
    room free. The run row comes after the instances, as everywhere (docs/architecture.md §6).
    """
    run_store.lock_run_state(conn, run_id)
    active, held = mapping_store.active_and_held_back(conn, run_id=run_id, task_id=task_id)
    room = max_active - active
    if room <= 0 or not held:
        return []
    return mapping_store.queue_held_back(conn, held[:room], now=now)


def _source_value(conn: Connection, version: DagVersion, run_id: str, source: str) -> Any:
    """The result a mapped task expands: the source's own, or a mapped source's list."""
    if version.structure.tasks[source].map_arg is not None:
        return mapping_store.mapped_results(conn, [(run_id, source)])[(run_id, source)]
    return attempt_store.get_results(conn, [(run_id, source)]).get((run_id, source))


def _fail(
    conn: Connection,
    version: DagVersion,
    *,
    run_id: str,
    task_id: str,
    row_id: int,
    failure: MapFailure,
    now: Any,
) -> None:
    """Dead-letter a mapped task that cannot expand, with an attempt (never run) saying why."""
    template = mapping_store.waiting_row(conn, row_id)
    attempt = template["attempt"] + 1
    if not mapping_store.fail_expansion(
        conn, row_id=row_id, attempt=attempt, now=now, reason=DeadLetterReason.NON_RETRYABLE.value
    ):
        return
    attempt_store.insert_attempt(
        conn,
        task_instance_id=row_id,
        run_id=run_id,
        dag_id=version.structure.dag_id,
        task_id=task_id,
        attempt=attempt,
        outcome=AttemptOutcome.FAILED.value,
        error_type=failure.error_type,
        error_message=failure.message,
        traceback=None,
        fingerprint=fingerprint(failure.error_type, failure.message, "treadle.mapping"),
        worker_id=None,
        hostname=None,
        started_at=None,
        ended_at=now,
        duration_s=None,
        retry_delay_s=None,
    )


def claim_inputs(
    db: Database,
    conn: Connection,
    rows: Sequence[AttemptRow],
    version_ids: Mapping[str, int],
    known: Mapping[tuple[str, str], Any],
) -> list[tuple[dict[str, Any], Any]]:
    """For each claimed row, its upstream results by task id and, for a mapped instance, its
    element (`version_ids`: by run id; `known`: results already at hand by (run, task)).

    A mapped upstream's result is the list of its instances' results; a mapped instance gets
    its element instead of the list it maps over (one primary-key read for the batch).
    """
    plain: list[tuple[str, str]] = []
    lists: list[tuple[str, str]] = []
    wanted: list[list[tuple[str, str]]] = []
    for r in rows:
        tasks = version_of(db, conn, version_ids[r.run_id]).structure.tasks
        own = _upstreams_read(tasks[r.task_id], mapped=r.map_index >= 0)
        wanted.append([(r.run_id, u) for u in own])
        for u in own:
            (lists if tasks[u].map_arg is not None else plain).append((r.run_id, u))
    missing = [p for p in plain if p not in known]
    results: dict[tuple[str, str], Any] = {**attempt_store.get_results(conn, missing), **known}
    results.update(mapping_store.mapped_results(conn, lists))
    elements = mapping_store.items(
        conn, [(r.run_id, r.task_id, r.map_index) for r in rows if r.map_index >= 0]
    )
    return [
        ({u: results.get((run, u)) for run, u in pairs}, elements.get((r.run_id, r.task_id, r.map_index)))
        for r, pairs in zip(rows, wanted, strict=True)
    ]


def _upstreams_read(definition: TaskDef, *, mapped: bool) -> tuple[str, ...]:
    """The upstreams whose results an instance receives: a mapped instance does not receive the
    list it maps over (its element is its argument) unless another argument names that task."""
    if not mapped or definition.map_source is None:
        return tuple(definition.upstream)
    others = {a.upstream for k, a in definition.kwargs.items() if k != definition.map_arg}
    others.update(a.upstream for a in definition.args)
    return tuple(u for u in definition.upstream if u != definition.map_source or u in others)
