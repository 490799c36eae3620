"""Counts admission control reads: queued task instances in a queue and of a DAG, up to a cap.

Each count stops at `cap` rows (a LIMIT under the count), so its cost is bounded by the limit
being checked, not by how deep the queue is: a full queue of a million instances costs the same
as one at the limit.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.store.tables import task_instances as ti


def _capped_count(conn: Connection, condition: sa.ColumnElement[bool], cap: int) -> int:
    rows = sa.select(sa.literal(1)).select_from(ti).where(ti.c.state == TaskState.QUEUED.value, condition)
    limited = rows.limit(cap).subquery()
    return int(conn.execute(sa.select(sa.func.count()).select_from(limited)).scalar_one())


def queued_in_queue(conn: Connection, queue: str, *, cap: int) -> int:
    """Queued task instances in `queue`, counted up to `cap` (on the claim-order index)."""
    return _capped_count(conn, ti.c.queue == queue, cap)


def queued_in_dag(conn: Connection, dag_id: str, *, cap: int) -> int:
    """Queued task instances of `dag_id`, counted up to `cap` (on the (dag_id, state) index)."""
    return _capped_count(conn, ti.c.dag_id == dag_id, cap)
