"""Named leases on the database clock: who leads, until when, and under which epoch.

The epoch is a fencing token: it grows by one whenever the holder changes, and every write a
leader makes checks it in the same transaction (`hold`), so a leader that was paused past its
lease and resumes cannot write with its stale epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store import dialects
from treadle.store.tables import leases


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseInfo:
    """A lease row as stored."""

    name: str
    holder: str | None
    epoch: int
    acquired_at: datetime | None
    renewed_at: datetime | None
    expires_at: datetime | None


def acquire(
    conn: Connection, name: str, *, holder: str, epoch: int | None, lease_s: float, now: datetime
) -> int | None:
    """Take the lease if it is free or expired, or renew it if `holder` holds it at `epoch`.

    Returns the epoch held afterwards, or None when someone else holds a live lease (or this
    holder's epoch is stale: it lost the lease meanwhile and must start over).
    """
    conn.execute(dialects.insert_ignore(conn, leases).values(name=name, holder=None, epoch=0))
    row = conn.execute(dialects.lock_row(sa.select(leases).where(leases.c.name == name), conn)).one()
    expires = now + timedelta(seconds=lease_s)
    if row.holder == holder and epoch is not None and row.epoch == epoch and row.expires_at is not None:
        if row.expires_at <= now:
            return None  # lapsed: a renewal after expiry would hide a gap another leader may own
        conn.execute(
            sa.update(leases).where(leases.c.name == name).values(renewed_at=now, expires_at=expires)
        )
        return epoch
    if row.holder is not None and row.expires_at is not None and row.expires_at > now:
        return None
    new_epoch = int(row.epoch) + 1
    conn.execute(
        sa.update(leases)
        .where(leases.c.name == name, leases.c.epoch == row.epoch)
        .values(holder=holder, epoch=new_epoch, acquired_at=now, renewed_at=now, expires_at=expires)
    )
    return new_epoch


def hold(conn: Connection, name: str, *, holder: str, epoch: int, now: datetime) -> bool:
    """Lock the lease row (shared) and confirm `holder` still holds it at `epoch` (the write fence).

    Shared, so several transactions of the one leader may hold it at once; a change of holder
    (an UPDATE) waits until they have committed, and they see it once it has.
    """
    row = conn.execute(
        dialects.lock_row(
            sa.select(leases.c.holder, leases.c.epoch, leases.c.expires_at).where(leases.c.name == name),
            conn,
            shared=True,
        )
    ).first()
    return bool(
        row is not None
        and row.holder == holder
        and row.epoch == epoch
        and row.expires_at is not None
        and row.expires_at > now
    )


def release(conn: Connection, name: str, *, holder: str, epoch: int, now: datetime) -> bool:
    """Give the lease up at once (graceful stop), so a standby need not wait for it to lapse."""
    result = conn.execute(
        sa.update(leases)
        .where(leases.c.name == name, leases.c.holder == holder, leases.c.epoch == epoch)
        .values(holder=None, expires_at=now)
    )
    return bool(result.rowcount)


def get(conn: Connection, name: str) -> LeaseInfo | None:
    """Return the lease row, or None if it was never taken."""
    row = conn.execute(sa.select(leases).where(leases.c.name == name)).first()
    return LeaseInfo(**row._mapping) if row else None
