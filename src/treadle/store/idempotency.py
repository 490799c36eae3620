"""Idempotency-Key rows: claim a key inside a change's transaction, record and read its response.

Nothing here decides what a key means for a request (engine/idempotency.py does); these are
the statements, with the primary key deciding between two requests that claim one key at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store import dialects
from treadle.store.tables import idempotency_keys


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRow:
    """One claimed key."""

    key_hash: str
    fingerprint: str
    request_line: str
    claim: str
    #: None while the claiming request has not recorded its response.
    status_code: int | None
    response: Any  # Any: the JSON body recorded
    created_at: datetime
    expires_at: datetime


def get_key(conn: Connection, key_hash: str) -> KeyRow | None:
    """The key's row, expired or not (None: never claimed, or pruned)."""
    found = get_key_and_clock(conn, key_hash)
    return found[0] if found is not None else None


def get_key_and_clock(conn: Connection, key_hash: str) -> tuple[KeyRow, datetime] | None:
    """The key's row, expired or not, and the database clock, in one statement (None: never
    claimed, or pruned)."""
    stmt = sa.select(idempotency_keys, dialects.clock_sql(conn).label("clock")).where(
        idempotency_keys.c.key_hash == key_hash
    )
    row = conn.execute(stmt).first()
    if row is None:
        return None
    key = KeyRow(
        key_hash=row.key_hash,
        fingerprint=row.fingerprint,
        request_line=row.request_line,
        claim=row.claim,
        status_code=row.status_code,
        response=row.response,
        created_at=row.created_at,
        expires_at=row.expires_at,
    )
    return key, dialects.clock_value(conn, row.clock)


def insert_claim(
    conn: Connection,
    *,
    key_hash: str,
    fingerprint: str,
    request_line: str,
    claim: str,
    now: datetime,
    expires_at: datetime,
) -> bool:
    """Claim the key unless a row holds it; True if the row now holds this `claim`.

    On PostgreSQL and MySQL an insert that meets another transaction's uncommitted claim waits
    for it: it inserts if that one rolls back and skips if it commits. SQLite's writer lock
    serialises the two. The insert returns the row it made where the dialect can (a skipped
    row returns nothing); elsewhere the row is read back rather than trusting the insert's
    rowcount, which drivers do not all report for a skipped row.
    """
    stmt = dialects.insert_ignore(conn, idempotency_keys).values(
        key_hash=key_hash,
        fingerprint=fingerprint,
        request_line=request_line[:500],
        claim=claim,
        status_code=None,
        response=None,
        created_at=now,
        expires_at=expires_at,
    )
    inserted = dialects.inserted_rows(conn, stmt, idempotency_keys.c.claim)
    if inserted is not None:
        return bool(inserted)
    held = conn.execute(
        sa.select(idempotency_keys.c.claim).where(idempotency_keys.c.key_hash == key_hash)
    ).scalar_one_or_none()
    return held == claim


def delete_if_expired(conn: Connection, key_hash: str, *, now: datetime) -> bool:
    """Delete the key's row if it expired by `now`; True if it did."""
    stmt = sa.delete(idempotency_keys).where(
        idempotency_keys.c.key_hash == key_hash, idempotency_keys.c.expires_at <= now
    )
    return bool(conn.execute(stmt).rowcount)


def record_response(
    conn: Connection,
    *,
    key_hash: str,
    claim: str,
    status_code: int,
    response: Any,
    replace: bool = False,
) -> bool:
    """Store the response of the request holding `claim` (`replace`: over the one it stored
    already); False if the row is not its own, or already has a response and not `replace`."""
    stmt = (
        sa.update(idempotency_keys)
        .where(idempotency_keys.c.key_hash == key_hash, idempotency_keys.c.claim == claim)
        .values(status_code=status_code, response=response)
    )
    if not replace:
        stmt = stmt.where(idempotency_keys.c.status_code.is_(None))
    return bool(conn.execute(stmt).rowcount)


def delete_expired(conn: Connection, *, now: datetime, limit: int) -> int:
    """Delete up to `limit` keys expired by `now` (oldest first); returns how many."""
    hashes = list(
        conn.execute(
            sa.select(idempotency_keys.c.key_hash)
            .where(idempotency_keys.c.expires_at <= now)
            .order_by(idempotency_keys.c.expires_at)
            .limit(limit)
        ).scalars()
    )
    if not hashes:
        return 0
    stmt = sa.delete(idempotency_keys).where(
        idempotency_keys.c.key_hash.in_(hashes), idempotency_keys.c.expires_at <= now
    )
    return int(conn.execute(stmt).rowcount)


def count_expired(conn: Connection, *, now: datetime) -> int:
    """Keys expired by `now` (what a prune would delete)."""
    stmt = (
        sa.select(sa.func.count()).select_from(idempotency_keys).where(idempotency_keys.c.expires_at <= now)
    )
    return int(conn.execute(stmt).scalar_one())
