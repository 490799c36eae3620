"""Freshness SLO misses already alerted."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.freshness import Miss
from treadle.store import dialects
from treadle.store.tables import freshness_alerts


def record_miss(conn: Connection, miss: Miss, *, now: datetime) -> bool:
    """Note `miss` as alerted; False when it already was (nothing written).

    The caller holds the leader lease, so no other writer races this check; the insert still
    ignores a duplicate key rather than fail the transaction.
    """
    seen = conn.execute(sa.select(freshness_alerts.c.key).where(freshness_alerts.c.key == miss.key)).first()
    if seen is not None:
        return False
    stmt = dialects.insert_ignore(conn, freshness_alerts).values(
        key=miss.key, dag_id=miss.dag_id, dataset=miss.dataset, period=miss.period, alerted_at=now
    )
    conn.execute(stmt)
    return True
