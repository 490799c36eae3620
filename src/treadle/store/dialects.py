"""The few places where SQLite and PostgreSQL differ: clock, claim locking, notifications."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

#: Channel that workers LISTEN on for "a task became ready".
READY_CHANNEL = "treadle_ready"


def now(conn: Connection) -> datetime:
    """Return the database clock as an aware UTC datetime."""
    if conn.dialect.name == "sqlite":
        text = conn.exec_driver_sql("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')").scalar_one()
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    value = conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


def lock_for_claim(stmt: sa.Select[tuple[int]], conn: Connection) -> sa.Select[tuple[int]]:
    """Add row locking that skips rows other claimers hold (SQLite serialises writers instead)."""
    if conn.dialect.name == "sqlite":
        return stmt
    return stmt.with_for_update(skip_locked=True)


def notify_ready(conn: Connection) -> None:
    """Wake idle workers after the transaction commits (PostgreSQL only; a hint, never needed)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"NOTIFY {READY_CHANNEL}")
