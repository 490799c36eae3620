"""Counts admission control reads: queued task instances per queue and per DAG."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.store.tables import task_instances as ti


def queued_by_queue(conn: Connection, queues: Iterable[str]) -> dict[str, int]:
    """Queued task instances in each of `queues` (absent: none); reads the claim-order index."""
    names = sorted(set(queues))
    if not names:
        return {}
    stmt = (
        sa.select(ti.c.queue, sa.func.count())
        .where(ti.c.state == TaskState.QUEUED.value, ti.c.queue.in_(names))
        .group_by(ti.c.queue)
    )
    return {str(queue): int(n) for queue, n in conn.execute(stmt)}


def queued_in_dags(conn: Connection, dag_ids: Iterable[str]) -> dict[str, int]:
    """Queued task instances of each of `dag_ids` (absent: none); reads the (dag_id, state) index."""
    ids = sorted(set(dag_ids))
    if not ids:
        return {}
    stmt = (
        sa.select(ti.c.dag_id, sa.func.count())
        .where(ti.c.state == TaskState.QUEUED.value, ti.c.dag_id.in_(ids))
        .group_by(ti.c.dag_id)
    )
    return {str(dag_id): int(n) for dag_id, n in conn.execute(stmt)}
