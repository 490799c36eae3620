"""Queries for trigger rules: counting upstream ends on waiting rows and moving them on.

The default path (a success readying plain `all_success` rows) is `count_upstream_successes`
in store/task_instances.py, one UPDATE for a batch; these statements serve the rest (a failed
or skipped upstream, a task with another rule, a mapped task) one waiting row at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.domain.transitions import UseCase, task_sources
from treadle.domain.trigger_rules import End, UpstreamCounts
from treadle.store import dialects
from treadle.store.tables import task_instances as ti
from treadle.store.task_instances import stamp

#: The counter column each kind of upstream end adds to.
_COUNTER = {
    End.SUCCESS: ti.c.upstream_done,
    End.FAILED: ti.c.upstream_failures,
    End.SKIPPED: ti.c.upstream_skips,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """A pending row (of an unmapped task, or the one row of a mapped task not yet expanded)."""

    id: int
    queue: str
    counts: UpstreamCounts


def count_end(conn: Connection, *, run_id: str, task_id: str, end: End, n: int) -> Waiting | None:
    """Add `n` upstream ends of one kind to the pending row of (run, task); None if that task's
    row is no longer pending (it ran, was decided, or is a mapped task already expanded).

    The row stays locked until commit, so the caller's decision about it cannot race another
    upstream's end: a concurrent one waits, then sees these counts.
    """
    column = _COUNTER[end]
    stmt = (
        sa.update(ti)
        .where(
            ti.c.run_id == run_id,
            ti.c.task_id == task_id,
            ti.c.map_index == -1,
            ti.c.state == TaskState.PENDING.value,
        )
        .values({column: column + n})
    )
    rows = dialects.update_returning(conn, stmt, _WAITING_COLUMNS, key=ti.c.id)
    return _waiting(rows[0]) if rows else None


_WAITING_COLUMNS = (
    ti.c.id,
    ti.c.queue,
    ti.c.upstream_done,
    ti.c.upstream_failures,
    ti.c.upstream_skips,
    ti.c.upstream_total,
)


def _waiting(row: Any) -> Waiting:  # Any: a Row with _WAITING_COLUMNS
    return Waiting(
        id=row.id,
        queue=row.queue,
        counts=UpstreamCounts(
            success=row.upstream_done,
            failed=row.upstream_failures,
            skipped=row.upstream_skips,
            total=row.upstream_total,
        ),
    )


def ready(conn: Connection, ids: Sequence[int], *, now: datetime | None) -> list[str]:
    """pending -> queued for these rows (their rule is met); returns the queues of those moved."""
    if not ids:
        return []
    at = stamp(now)
    stmt = (
        sa.update(ti)
        .where(ti.c.id.in_(sorted(ids)), ti.c.state.in_(task_sources(UseCase.READY, TaskState.QUEUED)))
        .values(
            state=TaskState.QUEUED.value,
            queued_at=at,
            dispatch_deadline=dialects.plus_seconds(conn, at, ti.c.queue_timeout_s),
        )
    )
    return [r.queue for r in dialects.update_returning(conn, stmt, (ti.c.id, ti.c.queue), key=ti.c.id)]


def end_waiting(
    conn: Connection, ids: Sequence[int], *, state: TaskState, by: UseCase, now: datetime | None
) -> int:
    """pending -> `state` (skipped, upstream_failed) for rows whose rule can no longer be met."""
    if not ids:
        return 0
    result = conn.execute(
        sa.update(ti)
        .where(ti.c.id.in_(sorted(ids)), ti.c.state.in_(task_sources(by, state)))
        .values(state=state.value, ended_at=stamp(now))
    )
    return int(result.rowcount)


def ready_mapped(
    conn: Connection, *, run_id: str, task_id: str, map_index: int, now: datetime | None
) -> list[str]:
    """Queue the mapped instance at `map_index` if it is still held back (max_active_mapped)."""
    at = stamp(now)
    stmt = (
        sa.update(ti)
        .where(
            ti.c.run_id == run_id,
            ti.c.task_id == task_id,
            ti.c.map_index == map_index,
            ti.c.state.in_(task_sources(UseCase.READY, TaskState.QUEUED)),
        )
        .values(
            state=TaskState.QUEUED.value,
            queued_at=at,
            dispatch_deadline=dialects.plus_seconds(conn, at, ti.c.queue_timeout_s),
        )
    )
    return [r.queue for r in dialects.update_returning(conn, stmt, (ti.c.id, ti.c.queue), key=ti.c.id)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """One live instance of a task in a run (retired mapped rows are left out)."""

    id: int
    task_id: str
    map_index: int
    state: str


def instances_of(conn: Connection, *, run_id: str, task_ids: Iterable[str]) -> list[Instance]:
    """The live instances of these tasks in a run, by task and map index (an index range scan)."""
    wanted = sorted(set(task_ids))
    if not wanted:
        return []
    stmt = (
        sa.select(ti.c.id, ti.c.task_id, ti.c.map_index, ti.c.state)
        .where(ti.c.run_id == run_id, ti.c.task_id.in_(wanted), ti.c.map_index >= -1)
        .order_by(ti.c.task_id, ti.c.map_index)
    )
    return [Instance(**r._mapping) for r in conn.execute(stmt)]


def set_waiting_counts(conn: Connection, counts: Sequence[tuple[int, UpstreamCounts]]) -> int:
    """Write the upstream counters of pending rows (after a requeue or clear re-counted them)."""
    moved = 0
    for row_id, c in counts:
        result = conn.execute(
            sa.update(ti)
            .where(ti.c.id == row_id, ti.c.state == TaskState.PENDING.value)
            .values(
                upstream_done=c.success,
                upstream_failures=c.failed,
                upstream_skips=c.skipped,
                upstream_total=c.total,
            )
        )
        moved += result.rowcount
    return moved


def requeue_to_waiting(conn: Connection, *, task_instance_id: int, now: datetime) -> bool:
    """dead_letter -> pending with a fresh retry budget (a mapped task whose expansion failed:
    its rule is applied again and it expands); False if it is no longer a dead letter."""
    result = conn.execute(
        sa.update(ti)
        .where(
            ti.c.id == task_instance_id,
            ti.c.map_index == -1,
            ti.c.state.in_(task_sources(UseCase.REQUEUE, TaskState.PENDING)),
            ti.c.state == TaskState.DEAD_LETTER.value,
        )
        .values(
            state=TaskState.PENDING.value,
            budget_base=ti.c.attempt,
            orphaned_count=0,
            dead_letter_reason=None,
            ended_at=None,
        )
    )
    return bool(result.rowcount)
