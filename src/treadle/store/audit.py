"""The audit log: append-only record of who asked for what."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store.tables import audit_log

if TYPE_CHECKING:
    from treadle.domain.access import AuditEntry


def record(
    conn: Connection,
    *,
    at: datetime,
    actor: str,
    action: str,
    target: str,
    details: dict[str, Any] | None = None,
    address: str | None = None,
) -> None:
    """Append one entry (in the caller's transaction, with the change it describes).

    In a transaction of `Database.begin` the entry is written with the transaction's other
    entries, in one executemany just before the commit (an API trigger writes two; psycopg
    pipelines them in one round trip); elsewhere at once.
    """
    row = {
        "at": at,
        "actor": actor[:250],
        "action": action,
        "target": target[:500],
        "details": details or {},
        "address": address[:100] if address else None,
    }
    pending = conn.info.get(PENDING)
    if pending is None:
        conn.execute(_INSERT, row)
    else:
        pending.append(row)


#: conn.info key: the entries a transaction recorded and has not written yet (`write_pending`).
PENDING = "treadle_pending_audit"


def write_pending(conn: Connection) -> None:
    """Write the entries the transaction recorded, in their order, in one executemany."""
    rows = conn.info.get(PENDING)
    if rows:
        conn.execute(_INSERT, list(rows))
        rows.clear()


#: Built once, values bound per call: an entry goes with most writes, and building the
#: statement (and its cache key) each time cost more than the insert itself.
_INSERT = sa.insert(audit_log)


def list_entries(
    conn: Connection,
    *,
    since: datetime | None = None,
    actor: str | None = None,
    action: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """Entries newest first, filtered; `before_id` pages backwards (a cursor on the id)."""
    from treadle.domain.access import AuditEntry  # not at import: every Database imports this module

    stmt = sa.select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if since is not None:
        stmt = stmt.where(audit_log.c.at >= since)
    if actor is not None:
        stmt = stmt.where(audit_log.c.actor == actor)
    if action is not None:
        stmt = stmt.where(audit_log.c.action == action)
    if before_id is not None:
        stmt = stmt.where(audit_log.c.id < before_id)
    return [
        AuditEntry(
            id=r.id,
            at=r.at,
            actor=r.actor,
            action=r.action,
            target=r.target,
            details=r.details or {},
            address=r.address,
        )
        for r in conn.execute(stmt)
    ]


def count_recent(
    conn: Connection, *, action: str, since: datetime, target: str | None = None, address: str | None = None
) -> int:
    """How many `action` entries since `since`, for one target or one address (login throttling).

    A range on the `at` index: only the last window's entries are read.
    """
    stmt = (
        sa.select(sa.func.count())
        .select_from(audit_log)
        .where(audit_log.c.at >= since, audit_log.c.action == action)
    )
    if target is not None:
        stmt = stmt.where(audit_log.c.target == target)
    if address is not None:
        stmt = stmt.where(audit_log.c.address == address)
    return int(conn.execute(stmt).scalar_one())
