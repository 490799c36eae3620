"""The outbox table: entries added in the caller's transaction, claimed by the relay with an
acknowledgement deadline, settled by compare-and-set on the claiming epoch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.outbox import OutboxEntry, OutboxState
from treadle.store import dialects
from treadle.store.tables import outbox

_COLUMNS = (
    outbox.c.id,
    outbox.c.kind,
    outbox.c.sink,
    outbox.c.payload,
    outbox.c.state,
    outbox.c.attempts,
    outbox.c.next_attempt_at,
    outbox.c.created_at,
    outbox.c.delivered_at,
    outbox.c.last_error,
)


def _entries(rows: Any) -> list[OutboxEntry]:  # Any: an iterable of Rows
    return [OutboxEntry(**r._mapping) for r in rows]


def enqueue(
    conn: Connection, *, kind: str, sink: str, payloads: Sequence[dict[str, Any]], now: datetime
) -> None:
    """Add one pending entry per payload, due at once (in the caller's transaction)."""
    if not payloads:
        return
    dialects.insert_many(
        conn,
        outbox,
        [
            {
                "kind": kind,
                "sink": sink,
                "payload": p,
                "state": OutboxState.PENDING.value,
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            }
            for p in payloads
        ],
    )


def claim(conn: Connection, *, now: datetime, limit: int, ack_s: float, epoch: int) -> list[OutboxEntry]:
    """Take up to `limit` due pending entries, oldest first, that no relay holds within its
    acknowledgement deadline; they are held until `now + ack_s` for `epoch`."""
    stmt = (
        sa.select(*_COLUMNS)
        .where(
            outbox.c.state == OutboxState.PENDING.value,
            outbox.c.next_attempt_at <= now,
            sa.or_(outbox.c.claimed_until.is_(None), outbox.c.claimed_until < now),
        )
        .order_by(outbox.c.next_attempt_at, outbox.c.id)
        .limit(limit)
    )
    found = _entries(conn.execute(dialects.lock_for_claim(stmt, conn)))
    if found:
        conn.execute(
            sa.update(outbox)
            .where(outbox.c.id.in_([e.id for e in found]))
            .values(claimed_until=now + timedelta(seconds=ack_s), leader_epoch=epoch)
        )
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Settlement:
    """How one claimed entry's delivery ended."""

    id: int
    delivered: bool
    dead: bool = False
    #: When to try again (a failure that is not dead).
    next_attempt_at: datetime | None = None
    error: str | None = None


def settle(conn: Connection, settlements: Sequence[Settlement], *, epoch: int, now: datetime) -> int:
    """Record deliveries of entries claimed at `epoch` (an entry another epoch claimed since is
    left alone); returns how many rows changed. The deliveries go in one statement, each
    failure in its own (its next try and error are its own)."""
    pending = OutboxState.PENDING.value
    delivered = [s.id for s in settlements if s.delivered]
    changed = 0
    if delivered:
        changed += conn.execute(
            sa.update(outbox)
            .where(outbox.c.id.in_(delivered), outbox.c.leader_epoch == epoch, outbox.c.state == pending)
            .values(
                state=OutboxState.DELIVERED.value,
                delivered_at=now,
                attempts=outbox.c.attempts + 1,
                claimed_until=None,
            )
        ).rowcount
    for s in settlements:
        if s.delivered:
            continue
        values: dict[str, Any] = {
            "state": (OutboxState.DEAD if s.dead else OutboxState.PENDING).value,
            "last_error": (s.error or "")[:2000],
            "attempts": outbox.c.attempts + 1,
            "claimed_until": None,
        }
        if s.next_attempt_at is not None:
            values["next_attempt_at"] = s.next_attempt_at
        guard = (outbox.c.id == s.id, outbox.c.leader_epoch == epoch, outbox.c.state == pending)
        changed += conn.execute(sa.update(outbox).where(*guard).values(**values)).rowcount
    return changed


def list_entries(conn: Connection, *, state: str | None, limit: int) -> list[OutboxEntry]:
    """Entries, newest first, in `state` if given."""
    stmt = sa.select(*_COLUMNS).order_by(outbox.c.id.desc()).limit(limit)
    if state is not None:
        stmt = stmt.where(outbox.c.state == state)
    return _entries(conn.execute(stmt))


def replay(conn: Connection, *, ids: Sequence[int] | None, now: datetime) -> int:
    """Make dead entries (those of `ids`, or all when None) pending again with a fresh budget."""
    stmt = sa.update(outbox).where(outbox.c.state == OutboxState.DEAD.value)
    if ids is not None:
        stmt = stmt.where(outbox.c.id.in_(list(ids)))
    values = {
        "state": OutboxState.PENDING.value,
        "attempts": 0,
        "next_attempt_at": now,
        "claimed_until": None,
    }
    return int(conn.execute(stmt.values(**values)).rowcount)


def purge(conn: Connection, *, states: Sequence[str], before: datetime) -> int:
    """Delete entries in `states` created before `before`; returns how many."""
    stmt = sa.delete(outbox).where(outbox.c.state.in_(list(states)), outbox.c.created_at < before)
    return int(conn.execute(stmt).rowcount)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxStats:
    """Pending and dead entries, and the oldest pending one's creation time."""

    pending: int
    dead: int
    oldest_pending_at: datetime | None


def stats(conn: Connection) -> OutboxStats:
    """One grouped query over pending and dead entries."""
    rows = conn.execute(
        sa.select(outbox.c.state, sa.func.count(), sa.func.min(outbox.c.created_at))
        .where(outbox.c.state.in_([OutboxState.PENDING.value, OutboxState.DEAD.value]))
        .group_by(outbox.c.state)
    ).all()
    by_state = {r[0]: (int(r[1]), r[2]) for r in rows}
    pending = by_state.get(OutboxState.PENDING.value, (0, None))
    return OutboxStats(
        pending=pending[0],
        dead=by_state.get(OutboxState.DEAD.value, (0, None))[0],
        oldest_pending_at=_aware(pending[1]),
    )


def _aware(value: object) -> datetime | None:
    """MIN() over a time column: text on SQLite, naive or aware elsewhere."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
