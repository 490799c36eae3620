"""Queries for mapped tasks: expanding the waiting row into one instance per element, their
elements, and their results as one list in map-index order."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.domain.transitions import UseCase, task_sources
from treadle.store import dialects
from treadle.store.tables import UTCDateTime, task_map_items, task_results
from treadle.store.tables import task_instances as ti
from treadle.store.task_instances import requeue_reset, stamp

#: Columns a mapped instance copies from the row it was expanded from.
_COPIED = (
    "run_id",
    "dag_id",
    "task_id",
    "queue",
    "priority_weight",
    "pool",
    "pool_slots",
    "queue_timeout_s",
    "timeout_s",
)


def waiting_row(conn: Connection, row_id: int) -> dict[str, Any]:
    """The columns of a mapped task's waiting row that its instances copy, with its attempt."""
    row = conn.execute(sa.select(*(ti.c[c] for c in _COPIED), ti.c.attempt).where(ti.c.id == row_id)).one()
    return dict(row._mapping)


def expand(
    conn: Connection,
    *,
    row_id: int,
    template: dict[str, Any],
    length: int,
    active: int,
    now: datetime,
) -> bool:
    """Turn the waiting row into instance 0 and create instances 1..length-1 from it, in one
    INSERT ... SELECT (the database makes the rows); the first `active` are queued, the rest
    wait (held back). False if the row was no longer waiting (nothing is written then)."""
    timeout = template["queue_timeout_s"]
    deadline = None if timeout is None else now + timedelta(seconds=timeout)
    moved = conn.execute(
        sa.update(ti)
        .where(
            ti.c.id == row_id,
            ti.c.map_index == -1,
            ti.c.state.in_(task_sources(UseCase.READY, TaskState.QUEUED)),
        )
        .values(
            map_index=0,
            state=TaskState.QUEUED.value,
            queued_at=sa.literal(now, UTCDateTime()),
            dispatch_deadline=sa.literal(deadline, UTCDateTime()),
        )
    ).rowcount
    if not moved or length < 2:
        return bool(moved)
    series = _series(1, length - 1)
    i = series.c.i
    queued = i < active
    at, until = sa.literal(now, UTCDateTime()), sa.literal(deadline, UTCDateTime())
    copied = {
        **{c: ti.c[c] for c in _COPIED},
        "map_index": i,
        "state": sa.case((queued, TaskState.QUEUED.value), else_=TaskState.PENDING.value),
        "attempt": sa.literal(0),
        "budget_base": sa.literal(0),
        "orphaned_count": sa.literal(0),
        "upstream_total": sa.literal(0),
        "upstream_done": sa.literal(0),
        "upstream_failures": sa.literal(0),
        "upstream_skips": sa.literal(0),
        "queued_at": sa.case((queued, at), else_=sa.null()),
        "dispatch_deadline": sa.case((queued, until), else_=sa.null()),
    }
    rows = sa.select(*copied.values()).select_from(series.join(ti, sa.true())).where(ti.c.id == row_id)
    conn.execute(sa.insert(ti).from_select(list(copied), rows))
    return True


def _series(first: int, last: int) -> sa.Subquery:
    """The integers first..last as rows of column `i` (any dialect: digits cross-joined)."""
    digits = sa.union_all(*(sa.select(sa.literal(d, sa.Integer).label("d")) for d in range(10)))
    places = max(len(str(last)), 1)
    tables = [digits.subquery(f"d{p}") for p in range(places)]
    number = sum((t.c.d * 10**p for p, t in enumerate(tables)), sa.literal(0, sa.Integer))
    joined: sa.FromClause = tables[0]
    for t in tables[1:]:
        joined = joined.join(t, sa.true())
    return (
        sa.select(number.label("i")).select_from(joined).where(number.between(first, last)).subquery("series")
    )


def copy_elements(conn: Connection, *, run_id: str, task_id: str, source: str, source_mapped: bool) -> None:
    """Store each instance's element, database-side in one statement: the elements of the
    source's list result, or, for a mapped source, its instances' results. Elements an earlier
    expansion of the task stored are replaced."""
    items = task_map_items
    conn.execute(sa.delete(items).where(items.c.run_id == run_id, items.c.task_id == task_id))
    theirs = sa.and_(ti.c.run_id == run_id, ti.c.task_id == source)
    if source_mapped:
        rows = (
            sa.select(sa.literal(run_id), sa.literal(task_id), ti.c.map_index, task_results.c.value)
            .select_from(ti.outerjoin(task_results, task_results.c.task_instance_id == ti.c.id))
            .where(theirs, ti.c.map_index >= 0)
        )
    else:
        elements, index, element = dialects.json_array_elements(conn, task_results.c.value)
        result = sa.select(ti.c.id).where(theirs, ti.c.map_index == -1).scalar_subquery()
        rows = (
            sa.select(sa.literal(run_id), sa.literal(task_id), index, element)
            .select_from(task_results.join(elements, sa.true()))
            .where(task_results.c.task_instance_id == result)
        )
    conn.execute(sa.insert(items).from_select(["run_id", "task_id", "map_index", "value"], rows))


def items(conn: Connection, instances: Sequence[tuple[str, str, int]]) -> dict[tuple[str, str, int], Any]:
    """The element of each mapped instance, by (run id, task id, map index)."""
    if not instances:
        return {}
    wanted = sorted(set(instances))
    rows = conn.execute(
        sa.select(task_map_items).where(
            task_map_items.c.run_id.in_(sorted({r for r, _, _ in wanted})),
            sa.tuple_(task_map_items.c.run_id, task_map_items.c.task_id, task_map_items.c.map_index).in_(
                wanted
            ),
        )
    )
    return {(r.run_id, r.task_id, r.map_index): r.value for r in rows}


def add_to_totals(conn: Connection, *, run_id: str, task_ids: Sequence[str], delta: int) -> None:
    """Count `delta` more upstream instances on the waiting rows of these tasks (an expansion)."""
    if task_ids and delta:
        conn.execute(
            sa.update(ti)
            .where(ti.c.run_id == run_id, ti.c.task_id.in_(sorted(task_ids)), ti.c.map_index == -1)
            .values(upstream_total=ti.c.upstream_total + delta)
        )


def fail_expansion(conn: Connection, *, row_id: int, attempt: int, now: datetime, reason: str) -> bool:
    """pending -> dead_letter for a mapped task whose list cannot be expanded, consuming `attempt`."""
    result = conn.execute(
        sa.update(ti)
        .where(
            ti.c.id == row_id,
            ti.c.map_index == -1,
            ti.c.state.in_(task_sources(UseCase.EXPAND, TaskState.DEAD_LETTER)),
        )
        .values(
            state=TaskState.DEAD_LETTER.value,
            attempt=attempt,
            ended_at=now,
            dead_letter_reason=reason,
        )
    )
    return bool(result.rowcount)


def mapped_results(conn: Connection, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[Any]]:
    """The results of mapped tasks by (run id, task id): one entry per instance in map-index
    order, None where an instance did not succeed or returned nothing (an index scan per task)."""
    found: dict[tuple[str, str], list[Any]] = {p: [] for p in pairs}
    for run_id, task_id in sorted(set(pairs)):
        stmt = (
            sa.select(ti.c.state, task_results.c.value)
            .select_from(ti.outerjoin(task_results, task_results.c.task_instance_id == ti.c.id))
            .where(ti.c.run_id == run_id, ti.c.task_id == task_id, ti.c.map_index >= 0)
            .order_by(ti.c.map_index)
        )
        found[(run_id, task_id)] = [
            r.value if r.state == TaskState.SUCCESS.value else None for r in conn.execute(stmt)
        ]
    return found


def retire(conn: Connection, ids: Sequence[int], *, now: datetime) -> int:
    """Take mapped instances out of their task (a clear folded it back into one row): skipped,
    at a negative map index of their own (-1 - id) so the task's indexes are free again; their
    attempts stay in the history."""
    moved = 0
    for row_id in ids:
        result = conn.execute(
            sa.update(ti)
            .where(ti.c.id == row_id, ti.c.map_index >= 0, ti.c.state.in_(_RETIRABLE))
            .values(
                map_index=-1 - ti.c.id,
                state=TaskState.SKIPPED.value,
                ended_at=sa.func.coalesce(ti.c.ended_at, sa.literal(now, UTCDateTime())),
            )
        )
        moved += result.rowcount
    return moved


_RETIRABLE = (*task_sources(UseCase.CLEAR, TaskState.SKIPPED), TaskState.SKIPPED.value)


#: States of a mapped instance that take one of its task's `max_active_mapped` places: every
#: state between queued and its end (a retry wait, a sensor between pokes, needs_inspection).
_HOLDING = tuple(
    s.value
    for s in (
        TaskState.QUEUED,
        TaskState.RUNNING,
        TaskState.RETRY_WAIT,
        TaskState.UP_FOR_RESCHEDULE,
        TaskState.NEEDS_INSPECTION,
    )
)


def active_and_held_back(conn: Connection, *, run_id: str, task_id: str) -> tuple[int, list[int]]:
    """How many instances of a mapped task hold a place under `max_active_mapped`, and the ids of
    its held-back instances (pending, map index >= 0) in map-index order. One index range scan."""
    stmt = (
        sa.select(ti.c.id, ti.c.state)
        .where(
            ti.c.run_id == run_id,
            ti.c.task_id == task_id,
            ti.c.map_index >= 0,
            ti.c.state.in_((*_HOLDING, TaskState.PENDING.value)),
        )
        .order_by(ti.c.map_index)
    )
    active, held = 0, []
    for r in conn.execute(stmt):
        if r.state == TaskState.PENDING.value:
            held.append(r.id)
        else:
            active += 1
    return active, held


def queue_held_back(conn: Connection, ids: Sequence[int], *, now: datetime | None) -> list[str]:
    """Held-back mapped instances (pending, map index >= 0) -> queued; their queues."""
    if not ids:
        return []
    at = stamp(now)
    stmt = (
        sa.update(ti)
        .where(
            ti.c.id.in_(sorted(ids)),
            ti.c.map_index >= 0,
            ti.c.state.in_(task_sources(UseCase.READY, TaskState.QUEUED)),
        )
        .values(
            state=TaskState.QUEUED.value,
            queued_at=at,
            dispatch_deadline=dialects.plus_seconds(conn, at, ti.c.queue_timeout_s),
        )
    )
    return [r.queue for r in dialects.update_returning(conn, stmt, (ti.c.id, ti.c.queue), key=ti.c.id)]


def requeue_held_back(conn: Connection, *, task_instance_id: int, now: datetime, by: UseCase) -> bool:
    """A dead letter (`by` REQUEUE) or a needs_inspection instance (`by` RESOLVE) of a mapped task
    with `max_active_mapped` -> pending (held back) with a fresh retry budget, as a requeue to
    queued would leave it; the caller then lets held-back instances go up to the bound. False if
    it is no longer in a state `by` moves."""
    result = conn.execute(
        sa.update(ti)
        .where(
            ti.c.id == task_instance_id,
            ti.c.map_index >= 0,
            ti.c.state.in_(task_sources(by, TaskState.PENDING)),
            ti.c.state.in_((TaskState.DEAD_LETTER.value, TaskState.NEEDS_INSPECTION.value)),
        )
        .values(
            state=TaskState.PENDING.value,
            queued_at=None,
            dispatch_deadline=None,
            **requeue_reset(),
        )
    )
    return bool(result.rowcount)
