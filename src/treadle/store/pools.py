"""Queries on pools: named slot budgets that running task instances draw from."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.store.limits import pool_usage
from treadle.store.tables import pools
from treadle.store.tables import task_instances as ti


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolInfo:
    """A pool and how much of it is in use."""

    name: str
    slots: int
    description: str
    used_slots: int
    running: int
    queued: int
    updated_at: datetime


def upsert_pool(conn: Connection, *, name: str, slots: int, description: str | None, now: datetime) -> bool:
    """Create or resize a pool; returns True if it was created."""
    values: dict[str, object] = {"slots": slots, "updated_at": now}
    if description is not None:
        values["description"] = description
    if conn.execute(sa.update(pools).where(pools.c.name == name).values(**values)).rowcount:
        return False
    conn.execute(
        sa.insert(pools).values(
            name=name, slots=slots, description=description or "", created_at=now, updated_at=now
        )
    )
    return True


def delete_pool(conn: Connection, name: str) -> bool:
    """Delete a pool; returns False if there was none."""
    return bool(conn.execute(sa.delete(pools).where(pools.c.name == name)).rowcount)


def pool_demand(conn: Connection, name: str) -> tuple[int, int]:
    """(running, queued) task instances that use the pool."""
    rows = conn.execute(
        sa.select(ti.c.state, sa.func.count())
        .where(ti.c.pool == name, ti.c.state.in_([TaskState.RUNNING.value, TaskState.QUEUED.value]))
        .group_by(ti.c.state)
    )
    counts = {r[0]: int(r[1]) for r in rows}
    return counts.get(TaskState.RUNNING.value, 0), counts.get(TaskState.QUEUED.value, 0)


def list_pools(conn: Connection, names: list[str] | None = None) -> list[PoolInfo]:
    """Every pool (or the named ones) with its current use."""
    stmt = sa.select(pools).order_by(pools.c.name)
    if names is not None:
        stmt = stmt.where(pools.c.name.in_(names))
    rows = list(conn.execute(stmt))
    used = pool_usage(conn, [r.name for r in rows])
    result = []
    for r in rows:
        running, queued = pool_demand(conn, r.name)
        result.append(
            PoolInfo(
                name=r.name,
                slots=r.slots,
                description=r.description,
                used_slots=used[r.name],
                running=running,
                queued=queued,
                updated_at=r.updated_at,
            )
        )
    return result


def holders(conn: Connection, name: str, *, limit: int = 20) -> list[tuple[int, str, str, int]]:
    """Running task instances holding slots of a pool: (id, run id, task id, slots)."""
    rows = conn.execute(
        sa.select(ti.c.id, ti.c.run_id, ti.c.task_id, ti.c.pool_slots)
        .where(ti.c.pool == name, ti.c.state == TaskState.RUNNING.value)
        .order_by(ti.c.started_at)
        .limit(limit)
    )
    return [(r.id, r.run_id, r.task_id, r.pool_slots) for r in rows]
