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
) -> list[int]:
    """Turn the waiting row into instance 0 and insert instances 1..length-1; the first `active`
    are queued, the rest wait (held back). Returns the ids by map index; [] if the row was no
    longer waiting (nothing is written then)."""
    deadline = (
        None if template["queue_timeout_s"] is None else now + timedelta(seconds=template["queue_timeout_s"])
    )
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
    if not moved:
        return []
    rows = []
    for i in range(1, length):
        queued = i < active
        rows.append(
            {
                **{c: template[c] for c in _COPIED},
                "map_index": i,
                "state": (TaskState.QUEUED if queued else TaskState.PENDING).value,
                "attempt": 0,
                "budget_base": 0,
                "orphaned_count": 0,
                "upstream_total": 0,
                "upstream_done": 0,
                "upstream_failures": 0,
                "upstream_skips": 0,
                "queued_at": now if queued else None,
                "dispatch_deadline": deadline if queued else None,
            }
        )
    dialects.insert_many(conn, ti, rows)
    ids = conn.execute(
        sa.select(ti.c.map_index, ti.c.id)
        .where(ti.c.run_id == template["run_id"], ti.c.task_id == template["task_id"], ti.c.map_index >= 0)
        .order_by(ti.c.map_index)
    )
    return [r.id for r in ids]


def put_items(conn: Connection, run_id: str, items: Sequence[tuple[int, Any]]) -> None:
    """Store the element of each (instance id, element), replacing one stored before."""
    if items:
        stmt = dialects.upsert(conn, task_map_items, key="task_instance_id", update=("run_id", "value"))
        conn.execute(stmt, [{"task_instance_id": i, "run_id": run_id, "value": v} for i, v in items])


def items(conn: Connection, ids: Sequence[int]) -> dict[int, Any]:
    """The element of each mapped instance, by id."""
    if not ids:
        return {}
    rows = conn.execute(
        sa.select(task_map_items.c.task_instance_id, task_map_items.c.value).where(
            task_map_items.c.task_instance_id.in_(sorted(set(ids)))
        )
    )
    return {r.task_instance_id: r.value for r in rows}


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
