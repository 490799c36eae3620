"""The outbox use cases: effects written with the change that causes them; the leader's relay
claims due entries and settles their deliveries, both fenced by its epoch; operators list,
replay and purge (audited).

Effects are written only for the sinks the deployment configured (`Database.outbox_sinks`, set
by the process from TREADLE_OUTBOX_WEBHOOK_URL, _NATS_URL and TREADLE_ALERT_SLACK_URL): with no
sink, nothing piles up undelivered. Alerts go through the rules first (engine/alerts.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.outbox import ALERT_ONLY_SINKS, DeliveryPolicy, OutboxEntry, OutboxKind, after_failure
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.engine.scheduling import LEADER_LEASE
from treadle.errors import NotLeader
from treadle.store import audit, leases
from treadle.store import outbox as outbox_store
from treadle.store.database import Database, db_now
from treadle.store.outbox import OutboxStats, Settlement


def enqueue(db: Database, conn: Connection, *, kind: OutboxKind, payloads: Sequence[dict[str, Any]]) -> None:
    """Add `payloads` for every configured sink, in the caller's transaction; dead-letter
    payloads (`dead_letter_payload`) become the alerts their rules raise."""
    if not db.outbox_sinks or not payloads:
        return
    if kind is OutboxKind.TASK_DEAD_LETTER:
        from treadle.engine.alerts import dead_letters  # alerts writes through this module

        dead_letters(db, conn, payloads)
        return
    write_entries(db, conn, kind=kind, payloads=payloads)


def write_entries(
    db: Database, conn: Connection, *, kind: OutboxKind, payloads: Sequence[dict[str, Any]]
) -> None:
    """Write `payloads` as they are for every configured sink that takes `kind`."""
    now = db_now(conn)
    for sink in db.outbox_sinks:
        if sink in ALERT_ONLY_SINKS and not kind.is_alert:
            continue
        outbox_store.enqueue(conn, kind=kind.value, sink=sink, payloads=payloads, now=now)


def dataset_payloads(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The "dataset version published" payloads of recorded dataset_events rows."""
    return [
        {
            "dataset": r["dataset"],
            "version": r.get("version"),
            "run_id": r.get("run_id"),
            "dag_id": r.get("dag_id"),
            "task_id": r.get("task_id"),
            "extra": r.get("extra") or {},
            "published_at": r["created_at"].isoformat(),
        }
        for r in rows
    ]


def dead_letter_payload(
    task: ClaimedTask, error: AttemptError, *, reason: str | None, at: datetime
) -> dict[str, Any]:
    """The facts of a task instance that became a dead letter (its alerts carry them)."""
    quality = (error.outputs or {}).get("quality")
    return {
        **({"quality": quality} if isinstance(quality, dict) else {}),
        "severity": "error",
        "dag_id": task.dag_id,
        "task_id": task.task_id,
        "run_id": task.run_id,
        "map_index": task.map_index,
        "attempt": task.attempt,
        "reason": reason,
        "error_type": error.error_type,
        "message": error.message[:2000],
        "at": at.isoformat(),
        "next_action": (
            "find it with `treadle dead-letters list`, fix the cause, then `treadle dead-letters requeue`"
        ),
    }


def _fenced(db: Database, holder: str, epoch: int, work: Callable[[Connection, datetime], Any]) -> Any:
    def run(conn: Connection) -> Any:
        now = db_now(conn)
        if not leases.hold(conn, LEADER_LEASE, holder=holder, epoch=epoch, now=now):
            raise NotLeader(holder=holder, epoch=epoch)
        return work(conn, now)

    return db.transact(run)


def claim_deliveries(db: Database, *, holder: str, epoch: int, limit: int, ack_s: float) -> list[OutboxEntry]:
    """Take due entries for delivery within `ack_s` (leader only: NotLeader otherwise)."""
    found: list[OutboxEntry] = _fenced(
        db,
        holder,
        epoch,
        lambda conn, now: outbox_store.claim(conn, now=now, limit=limit, ack_s=ack_s, epoch=epoch),
    )
    return found


def settle_deliveries(
    db: Database,
    results: Sequence[tuple[OutboxEntry, str | None]],
    *,
    holder: str,
    epoch: int,
    policy: DeliveryPolicy,
) -> int:
    """Record each claimed entry's delivery: (entry, None) delivered, (entry, error) failed, to be
    retried with backoff or dead after `policy.max_attempts`. Returns the rows changed."""

    def work(conn: Connection, now: datetime) -> int:
        settlements = []
        for entry, error in results:
            if error is None:
                settlements.append(Settlement(id=entry.id, delivered=True))
                continue
            failed = after_failure(policy, attempts=entry.attempts + 1, rand=random.random())
            settlements.append(
                Settlement(
                    id=entry.id,
                    delivered=False,
                    dead=failed.dead,
                    next_attempt_at=None if failed.dead else now + timedelta(seconds=failed.delay_s),
                    error=error,
                )
            )
        return outbox_store.settle(conn, settlements, epoch=epoch, now=now)

    changed: int = _fenced(db, holder, epoch, work)
    return changed


def list_entries(db: Database, *, state: str | None = None, limit: int = 100) -> list[OutboxEntry]:
    """Entries newest first (in `state` if given)."""
    return db.query(lambda conn: outbox_store.list_entries(conn, state=state, limit=limit))


def outbox_stats(db: Database) -> OutboxStats:
    """Pending and dead counts and the oldest pending entry's time."""
    return db.query(outbox_store.stats)


def replay(db: Database, *, ids: Sequence[int] | None, actor: str) -> int:
    """Make dead entries (`ids`, or every dead one) pending again with a fresh budget (audited)."""

    def work(conn: Connection) -> int:
        now = db_now(conn)
        count = outbox_store.replay(conn, ids=ids, now=now)
        target = "all dead" if ids is None else ",".join(str(i) for i in ids)
        audit.record(
            conn, at=now, actor=actor, action="outbox.replay", target=target, details={"count": count}
        )
        return count

    return db.transact(work)


def purge(db: Database, *, states: Sequence[str], older_than: timedelta, actor: str) -> int:
    """Delete entries in `states` older than `older_than` (audited); returns how many."""

    def work(conn: Connection) -> int:
        now = db_now(conn)
        count = outbox_store.purge(conn, states=states, before=now - older_than)
        details = {"count": count, "older_than_s": older_than.total_seconds()}
        audit.record(
            conn, at=now, actor=actor, action="outbox.purge", target=",".join(states), details=details
        )
        return count

    return db.transact(work)
