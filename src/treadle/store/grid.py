"""Reads for the web UI's grid of recent runs by tasks: a few columns of many rows, in two queries."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store.tables import task_attempts, task_instances


def task_states(conn: Connection, run_ids: list[str]) -> list[tuple[str, str, int, str]]:
    """(run_id, task_id, map_index, state) of every task instance of the runs."""
    if not run_ids:
        return []
    ti = task_instances.c
    rows = conn.execute(
        sa.select(ti.run_id, ti.task_id, ti.map_index, ti.state).where(ti.run_id.in_(run_ids))
    )
    return [(r.run_id, r.task_id, r.map_index, r.state) for r in rows]


def success_durations(conn: Connection, run_ids: list[str]) -> dict[tuple[str, str], float]:
    """(run_id, task_id) -> the longest successful attempt's seconds (a mapped task: its slowest
    instance), for the runs."""
    if not run_ids:
        return {}
    a = task_attempts.c
    rows = conn.execute(
        sa.select(a.run_id, a.task_id, sa.func.max(a.duration_s).label("seconds"))
        .where(a.run_id.in_(run_ids), a.outcome == "success", a.duration_s.is_not(None))
        .group_by(a.run_id, a.task_id)
    )
    return {(r.run_id, r.task_id): float(r.seconds) for r in rows}
