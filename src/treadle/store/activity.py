"""Is there anything in flight? What an idle scheduler asks before it sleeps long."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import ACTIVE_TASK_STATES, RunState
from treadle.store.tables import backfills, dag_runs, task_instances

_ACTIVE_RUNS = (RunState.QUEUED.value, RunState.RUNNING.value)


def in_flight(conn: Connection) -> bool:
    """True while a run is queued or running, a task instance is not finished, or a backfill is
    running: then due retries, lease expiries, deadlines, runs to close and backfill intervals
    may come due without anyone waking the scheduler. Three index lookups."""
    checks = (
        sa.select(dag_runs.c.run_id).where(dag_runs.c.state.in_(_ACTIVE_RUNS)).limit(1),
        sa.select(task_instances.c.id)
        .where(task_instances.c.state.in_(sorted(s.value for s in ACTIVE_TASK_STATES)))
        .limit(1),
        sa.select(backfills.c.id).where(backfills.c.state == "running").limit(1),
    )
    return any(conn.execute(stmt).first() is not None for stmt in checks)
