"""Pausing and unpausing DAGs (recorded in the audit log).

A paused DAG gets no scheduled, dataset or backfill runs; its running runs go on. Unpausing
lets the scheduler fire what is due under the DAG's catch-up policy: with catchup off only the
latest missed interval runs, with catchup on every missed interval, oldest first.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from treadle.errors import DagNotFound
from treadle.store import audit
from treadle.store import dags as dag_store
from treadle.store.database import Database, db_now


def set_paused(db: Database, dag_id: str, *, paused: bool, actor: str) -> bool:
    """Pause or unpause a DAG; returns False when it already was so. Raises DagNotFound."""

    def work(conn: Connection) -> bool:
        now = db_now(conn)
        changed = dag_store.set_paused(conn, dag_id, paused=paused, now=now)
        if changed is None:
            raise DagNotFound(f"no DAG {dag_id!r} is registered")
        if changed:
            audit.record(
                conn, at=now, actor=actor, action="dag.pause" if paused else "dag.unpause", target=dag_id
            )
        return changed

    return db.transact(work)
