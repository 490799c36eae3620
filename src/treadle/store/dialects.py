"""The few places where SQLite and PostgreSQL differ: clock, claim locking, notifications."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store.tables import UTCDateTime

SelectT = TypeVar("SelectT", bound=sa.Select[Any])

#: Channel that workers LISTEN on for "a task became ready".
READY_CHANNEL = "treadle_ready"
#: Channel that tells workers to renew their leases now (a running attempt was cancelled).
CANCEL_CHANNEL = "treadle_cancel"


def now(conn: Connection) -> datetime:
    """Return the database clock as an aware UTC datetime."""
    if conn.dialect.name == "sqlite":
        text = conn.exec_driver_sql("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')").scalar_one()
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    value = conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


def lock_for_claim(stmt: SelectT, conn: Connection, *, of: sa.Table | None = None) -> SelectT:
    """Add row locking (of `of`'s rows) that skips rows other claimers hold.

    SQLite has no row locks: its single writer lock (BEGIN IMMEDIATE) serialises claims.
    """
    if conn.dialect.name == "sqlite":
        return stmt
    return stmt.with_for_update(skip_locked=True, of=of)


def plus_seconds(conn: Connection, base: Any, seconds: Any) -> Any:
    """SQL for `base + seconds` (a timestamp expression plus a number column); NULL stays NULL."""
    if conn.dialect.name == "sqlite":
        # printf() would turn NULL into 0 seconds: keep "no deadline" NULL explicitly.
        modifier = sa.func.printf("%+f seconds", seconds)
        expr = sa.case((seconds.is_(None), None), else_=sa.func.strftime("%Y-%m-%d %H:%M:%f", base, modifier))
    else:
        expr = base + sa.literal_column("interval '1 second'") * seconds
    return sa.type_coerce(expr, UTCDateTime())


def notify_cancel(conn: Connection) -> None:
    """Ask workers to check their attempts at once (PostgreSQL only; heartbeats catch it anyway)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"NOTIFY {CANCEL_CHANNEL}")


def notify_ready(conn: Connection) -> None:
    """Wake idle workers after the transaction commits (PostgreSQL only; a hint, never needed)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"NOTIFY {READY_CHANNEL}")
