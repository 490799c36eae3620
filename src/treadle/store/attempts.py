"""Attempt history (append-only) and small task results."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.task_records import AttemptInfo
from treadle.store import dialects
from treadle.store.tables import task_attempts, task_instances, task_results


def insert_attempt(conn: Connection, **values: Any) -> None:
    """Append one finished attempt (columns of `task_attempts`)."""
    conn.execute(sa.insert(task_attempts).values(**values))


def mark_late_result(conn: Connection, *, task_instance_id: int, attempt: int, note: str) -> bool:
    """Record on an attempt that its worker reported after losing it; returns False if no row."""
    result = conn.execute(
        sa.update(task_attempts)
        .where(task_attempts.c.task_instance_id == task_instance_id, task_attempts.c.attempt == attempt)
        .values(late_result=note[:250])
    )
    return bool(result.rowcount)


def list_attempts(conn: Connection, *, run_id: str) -> list[AttemptInfo]:
    """Return every attempt of a run, oldest first."""
    stmt = (
        sa.select(*[c for c in task_attempts.c if c.name not in ("id", "dag_id")])
        .where(task_attempts.c.run_id == run_id)
        .order_by(task_attempts.c.task_id, task_attempts.c.attempt)
    )
    return [AttemptInfo(**r._mapping) for r in conn.execute(stmt)]


def get_attempt(conn: Connection, *, task_instance_id: int, attempt: int) -> AttemptInfo | None:
    """Return one recorded attempt, or None (it is running, or never ended)."""
    stmt = sa.select(*[c for c in task_attempts.c if c.name not in ("id", "dag_id")]).where(
        task_attempts.c.task_instance_id == task_instance_id, task_attempts.c.attempt == attempt
    )
    row = conn.execute(stmt).first()
    return AttemptInfo(**row._mapping) if row else None


def last_attempts(conn: Connection, task_instance_ids: list[int]) -> dict[int, AttemptInfo]:
    """Return the latest attempt of each given task instance."""
    if not task_instance_ids:
        return {}
    stmt = (
        sa.select(*[c for c in task_attempts.c if c.name not in ("id", "dag_id")])
        .where(task_attempts.c.task_instance_id.in_(task_instance_ids))
        .order_by(task_attempts.c.attempt)
    )
    return {r.task_instance_id: AttemptInfo(**r._mapping) for r in conn.execute(stmt)}


def get_results(conn: Connection, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """Return results by (run_id, task_id) for the given pairs."""
    if not pairs:
        return {}
    run_ids = sorted({r for r, _ in pairs})
    task_ids = sorted({t for _, t in pairs})
    rows = conn.execute(
        sa.select(task_results.c.run_id, task_results.c.task_id, task_results.c.value).where(
            task_results.c.run_id.in_(run_ids), task_results.c.task_id.in_(task_ids)
        )
    )
    wanted = set(pairs)
    return {(r.run_id, r.task_id): r.value for r in rows if (r.run_id, r.task_id) in wanted}


def results_of_run(conn: Connection, run_id: str) -> dict[str, Any]:
    """Return every stored result of a run by task id; a mapped task's is the list of its
    instances' results in map-index order (None where one did not succeed)."""
    ti = task_instances
    rows = conn.execute(
        sa.select(
            ti.c.task_id, ti.c.map_index, ti.c.state, task_results.c.task_instance_id, task_results.c.value
        )
        .select_from(ti.outerjoin(task_results, task_results.c.task_instance_id == ti.c.id))
        .where(ti.c.run_id == run_id, ti.c.map_index >= -1)
        .order_by(ti.c.task_id, ti.c.map_index)
    )
    found: dict[str, Any] = {}
    for r in rows:
        if r.map_index >= 0:
            found.setdefault(r.task_id, []).append(r.value if r.state == "success" else None)
        elif r.task_instance_id is not None:
            found[r.task_id] = r.value
    return found


def insert_attempts(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Append finished attempts to `task_attempts` (columns of that table), batched by the driver.

    An executemany keeps one cached compiled statement whatever the row count.
    """
    if rows:
        conn.execute(sa.insert(task_attempts), rows)


def put_results(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Store task results (columns of `task_results`) in one upsert, replacing earlier ones."""
    if not rows:
        return
    stmt = dialects.upsert(
        conn,
        task_results,
        key="task_instance_id",
        update=("run_id", "task_id", "value", "size_bytes", "created_at"),
    )
    conn.execute(stmt, rows)
