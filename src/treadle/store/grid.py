"""Reads for the web UI's grid of recent runs by tasks: one row per run, aggregated in SQL.

A 25-run grid of a 500-task DAG is 12,500 cells. Returned as 12,500 rows, most of its time went
to the database grouping them and to Python handling one tuple per row; instead each run comes
back as one row whose text joins its tasks' `task_id TAB value` pairs (string_agg on
PostgreSQL, group_concat on SQLite and MariaDB), which Python splits in C. Task ids cannot hold
a tab (identifiers are `[A-Za-z0-9._-]`), so the pairs split unambiguously, whatever order the
database aggregated them in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store.tables import task_attempts, task_instances

_SEP = "\t"


@dataclass(frozen=True, slots=True)
class RunCells:
    """One run's plain (unmapped) task instances, and whether it has mapped ones."""

    #: Task ids and their states, aligned (in no particular order).
    task_ids: list[str]
    states: list[str]
    #: How many expanded instances (map_index >= 0) the run has; their counts by state come
    #: from `mapped_counts`.
    mapped: int


def run_cells(conn: Connection, run_ids: list[str]) -> dict[str, RunCells]:
    """Each run's task states, in one query returning a row per run. A run without task
    instances is missing. The instances a clear took out of a mapped task (map_index < -1)
    are not cells."""
    if not run_ids:
        return {}
    ti = task_instances.c
    plain = ti.map_index == -1
    rows = _raw_rows(
        conn,
        sa.select(
            ti.run_id,
            sa.func.aggregate_strings(sa.case((plain, ti.task_id + _SEP + ti.state)), _SEP),
            sa.func.sum(sa.case((plain, 1), else_=0)),
            sa.func.sum(sa.case((ti.map_index >= 0, 1), else_=0)),
        )
        .where(ti.run_id.in_(run_ids), ti.map_index >= -1)
        .group_by(ti.run_id),
    )
    found: dict[str, RunCells] = {}
    for run_id, text, n_plain, n_mapped in rows:
        parts = text.split(_SEP) if text else []
        if len(parts) != 2 * int(n_plain or 0):
            # The aggregate was cut short (MariaDB's group_concat_max_len): read the rows.
            parts = _plain_pairs(conn, run_id)
        found[run_id] = RunCells(task_ids=parts[0::2], states=parts[1::2], mapped=int(n_mapped or 0))
    return found


def _plain_pairs(conn: Connection, run_id: str) -> list[str]:
    ti = task_instances.c
    rows = _raw_rows(conn, sa.select(ti.task_id, ti.state).where(ti.run_id == run_id, ti.map_index == -1))
    return [value for row in rows for value in row]


def mapped_counts(conn: Connection, run_ids: list[str]) -> list[tuple[str, str, str, int]]:
    """(run_id, task_id, state, count) of the runs' expanded mapped instances."""
    if not run_ids:
        return []
    ti = task_instances.c
    rows = _raw_rows(
        conn,
        sa.select(ti.run_id, ti.task_id, ti.state, sa.func.count())
        .where(ti.run_id.in_(run_ids), ti.map_index >= 0)
        .group_by(ti.run_id, ti.task_id, ti.state),
    )
    return [(run_id, task_id, state, int(n)) for run_id, task_id, state, n in rows]


def success_seconds(conn: Connection, run_ids: list[str]) -> dict[str, dict[str, float]]:
    """run_id -> task_id -> the longest successful attempt's seconds (a mapped task: its slowest
    instance), in one query returning a row per run."""
    if not run_ids:
        return {}
    a = task_attempts.c
    rows = _raw_rows(
        conn,
        sa.select(
            a.run_id,
            sa.func.aggregate_strings(a.task_id + _SEP + sa.cast(a.duration_s, sa.String), _SEP),
            sa.func.count(),
        )
        .where(a.run_id.in_(run_ids), a.outcome == "success", a.duration_s.is_not(None))
        .group_by(a.run_id),
    )
    found: dict[str, dict[str, float]] = {}
    for run_id, text, n in rows:
        parts = text.split(_SEP) if text else []
        if len(parts) != 2 * int(n):
            parts = _success_pairs(conn, run_id)
        names, values = parts[0::2], list(map(float, parts[1::2]))
        seconds = dict(zip(names, values, strict=True))
        if len(seconds) < len(names):
            # A mapped task: several instances' attempts, the slowest counts.
            seconds = {}
            for name, value in zip(names, values, strict=True):
                if value > seconds.get(name, -1.0):
                    seconds[name] = value
        found[run_id] = seconds
    return found


def _success_pairs(conn: Connection, run_id: str) -> list[str]:
    a = task_attempts.c
    rows = _raw_rows(
        conn,
        sa.select(a.task_id, a.duration_s).where(
            a.run_id == run_id, a.outcome == "success", a.duration_s.is_not(None)
        ),
    )
    return [value for task_id, seconds in rows for value in (task_id, repr(float(seconds)))]


def _raw_rows(conn: Connection, query: sa.Select[Any]) -> list[tuple[Any, ...]]:  # Any: plain column values
    """The query's rows as the driver returns them (tuples), without building a Row object per
    row (the values are strings and numbers that need no type processing)."""
    result = conn.execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()
