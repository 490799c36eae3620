"""Putting finished task instances of a run back to run again (the SQL of a clear)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.clearing import InstanceState, Reset
from treadle.domain.states import TaskState
from treadle.domain.transitions import TransitionNotAllowed, UseCase, task_sources
from treadle.store import dialects
from treadle.store.tables import UTCDateTime
from treadle.store.tables import task_instances as ti


def lock_instances(conn: Connection, run_id: str) -> list[InstanceState]:
    """Every task instance of a run, locked for a clear."""
    stmt = (
        sa.select(ti.c.id, ti.c.task_id, ti.c.map_index, ti.c.state, ti.c.attempt)
        .where(ti.c.run_id == run_id)
        .order_by(ti.c.id)
    )
    return [InstanceState(**r._mapping) for r in conn.execute(dialects.lock_row(stmt, conn))]


def reset_instances(conn: Connection, resets: Sequence[Reset], *, now: datetime) -> int:
    """Put finished task instances back to queued or pending with a fresh retry budget.

    Each row moves only from the state and attempt the caller read (compare-and-set); the
    attempt number stays (history is kept, it is the fence) and becomes the budget base.
    Returns how many rows moved.
    """
    moved = 0
    stamp = sa.literal(now, UTCDateTime())
    for r in resets:
        target = TaskState.QUEUED if r.queued else TaskState.PENDING
        if r.expected not in task_sources(UseCase.CLEAR, target):
            raise TransitionNotAllowed(f"clear never moves {r.expected} to {target.value}")
        values: dict[str, Any] = {
            "state": target.value,
            # A pending row's counters are recounted from its upstreams right after (settle).
            "upstream_done": 0,
            "upstream_failures": 0,
            "upstream_skips": 0,
            "budget_base": ti.c.attempt,
            "orphaned_count": 0,
            "dead_letter_reason": None,
            "ended_at": None,
            "worker_id": None,
            "lease_expires_at": None,
            "timeout_at": None,
            "next_attempt_at": None,
            # A cleared sensor waits afresh; a cleared submit-then-poll task submits anew.
            "first_poke_at": None,
            "poll_handle": sa.null(),
            "queued_at": stamp if r.queued else None,
            "dispatch_deadline": dialects.plus_seconds(conn, stamp, ti.c.queue_timeout_s)
            if r.queued
            else None,
        }
        if r.map_index is not None:
            values["map_index"] = r.map_index
        result = conn.execute(
            sa.update(ti)
            .where(ti.c.id == r.id, ti.c.state == r.expected, ti.c.attempt == r.attempt)
            .values(**values)
        )
        moved += result.rowcount
    return moved
