"""Reads for the web UI's grid of recent runs by tasks: a few columns of many rows, in two queries."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store.tables import task_attempts, task_instances


def task_states(conn: Connection, run_ids: list[str]) -> list[tuple[str, str, bool, str, int]]:
    """(run_id, task_id, mapped, state, count) of the runs' task instances: one row per task of a
    run and state, `mapped` telling a mapped task's expanded instances (map_index >= 0) from a
    plain task (a 25 x 500 grid is 12,500 small rows; a mapped task folds into one per state)."""
    if not run_ids:
        return []
    ti = task_instances.c
    mapped = sa.case((ti.map_index >= 0, 1), else_=0).label("mapped")
    rows = _raw_rows(
        conn,
        sa.select(ti.run_id, ti.task_id, mapped, ti.state, sa.func.count().label("n"))
        .where(ti.run_id.in_(run_ids))
        .group_by(ti.run_id, ti.task_id, mapped, ti.state),
    )
    return [(run_id, task_id, bool(m), state, int(n)) for run_id, task_id, m, state, n in rows]


def success_durations(conn: Connection, run_ids: list[str]) -> dict[tuple[str, str], float]:
    """(run_id, task_id) -> the longest successful attempt's seconds (a mapped task: its slowest
    instance), for the runs."""
    if not run_ids:
        return {}
    a = task_attempts.c
    rows = _raw_rows(
        conn,
        sa.select(a.run_id, a.task_id, sa.func.max(a.duration_s).label("seconds"))
        .where(a.run_id.in_(run_ids), a.outcome == "success", a.duration_s.is_not(None))
        .group_by(a.run_id, a.task_id),
    )
    return {(run_id, task_id): float(seconds) for run_id, task_id, seconds in rows}


def _raw_rows(conn: Connection, query: sa.Select[Any]) -> list[tuple[Any, ...]]:  # Any: plain column values
    """The query's rows as the driver returns them (tuples), without building a Row object per
    row: these queries return thousands of rows of strings and numbers that need no type
    processing, and the Row objects were a third of the grid's cost."""
    result = conn.execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()
