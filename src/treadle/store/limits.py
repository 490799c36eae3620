"""Admission against pool slots and DAG `max_active_tasks`, counted where the claim happens.

Usage is derived (running task instances), never a counter that could drift: the limit rows
(pools, dags) are locked FOR UPDATE first, so two claimers of one pool take turns and the
second one counts the first one's committed claims (F15). On SQLite the single writer lock
already serialises claims.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.store import dialects
from treadle.store.tables import dags, pools
from treadle.store.tables import task_instances as ti


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A queued task instance a claimer would like to run."""

    id: int
    dag_id: str
    pool: str | None
    pool_slots: int
    #: The DAG's max_active_tasks when it has one (read with the candidate, locked only if set).
    dag_limit: int | None = None


@dataclass(slots=True)
class Exclusions:
    """What a claim round learned is full, so the next round looks past it."""

    ids: set[int] = field(default_factory=set)
    pools: set[str] = field(default_factory=set)
    dags: set[str] = field(default_factory=set)
    #: Candidates left queued, by reason ("pool", "dag_limit"): what metrics call refusals.
    refusals: Counter[str] = field(default_factory=Counter)


def admit(conn: Connection, candidates: list[Candidate], excluded: Exclusions) -> list[int]:
    """Return the ids of candidates that fit their pool and DAG limits, in candidate order.

    Rejected candidates stay queued; their full pools and DAGs are added to `excluded`.
    """
    limited = sorted({c.dag_id for c in candidates if c.dag_limit is not None})
    dag_limits = _lock_dag_limits(conn, limited)
    pool_sizes = _lock_pools(conn, sorted({c.pool for c in candidates if c.pool}))
    pool_used = pool_usage(conn, sorted(pool_sizes))
    dag_running = running_per_dag(conn, sorted(dag_limits))
    admitted = []
    for c in candidates:
        excluded.ids.add(c.id)
        if c.dag_id in dag_limits and dag_running[c.dag_id] + 1 > dag_limits[c.dag_id]:
            excluded.dags.add(c.dag_id)
            excluded.refusals["dag_limit"] += 1
            continue
        if c.pool is not None:
            size = pool_sizes.get(c.pool)
            if size is None or pool_used[c.pool] + c.pool_slots > size:
                excluded.pools.add(c.pool)
                excluded.refusals["pool"] += 1
                continue
            pool_used[c.pool] += c.pool_slots
        dag_running[c.dag_id] += 1
        admitted.append(c.id)
    return admitted


def _lock_dag_limits(conn: Connection, dag_ids: list[str]) -> dict[str, int]:
    if not dag_ids:
        return {}
    stmt = (
        sa.select(dags.c.dag_id, dags.c.max_active_tasks)
        .where(dags.c.dag_id.in_(dag_ids), dags.c.max_active_tasks.is_not(None))
        .order_by(dags.c.dag_id)
    )
    return {r.dag_id: r.max_active_tasks for r in conn.execute(dialects.lock_row(stmt, conn))}


def _lock_pools(conn: Connection, names: list[str]) -> dict[str, int]:
    if not names:
        return {}
    stmt = sa.select(pools.c.name, pools.c.slots).where(pools.c.name.in_(names)).order_by(pools.c.name)
    return {r.name: r.slots for r in conn.execute(dialects.lock_row(stmt, conn))}


def pool_usage(conn: Connection, names: list[str]) -> Counter[str]:
    """Slots held by running task instances, per pool."""
    used: Counter[str] = Counter()
    if names:
        rows = conn.execute(
            sa.select(ti.c.pool, sa.func.sum(ti.c.pool_slots))
            .where(ti.c.state == TaskState.RUNNING.value, ti.c.pool.in_(names))
            .group_by(ti.c.pool)
        )
        used.update({r[0]: int(r[1]) for r in rows})
    return used


def running_per_dag(conn: Connection, dag_ids: list[str]) -> Counter[str]:
    """Running task instances per DAG (all its runs)."""
    running: Counter[str] = Counter()
    if dag_ids:
        rows = conn.execute(
            sa.select(ti.c.dag_id, sa.func.count())
            .where(ti.c.state == TaskState.RUNNING.value, ti.c.dag_id.in_(dag_ids))
            .group_by(ti.c.dag_id)
        )
        running.update({r[0]: int(r[1]) for r in rows})
    return running
