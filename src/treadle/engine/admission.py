"""Admission control: refuse a trigger, backfill or dataset run that would overfill a queue.

The check runs inside the transaction that creates the work, so a refusal rolls everything
back (nothing half-created); the refusal itself is then audited in a transaction of its own
and counted in this process (`admission_refusal_counts`, for the metrics endpoint). The
decision is domain/admission.py's.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.admission import RETRY_AFTER_S, AdmissionLimits, Overload, find_overload
from treadle.domain.states import TaskState
from treadle.errors import Overloaded
from treadle.store import admission as admission_store
from treadle.store import audit
from treadle.store.database import Database, db_now

#: The audit action of every refusal.
REFUSED_ACTION = "admission.refused"
#: A dataset run held back is re-examined every scheduler tick; one audit entry per DAG per
#: this many seconds is enough to say it is being held back.
DATASET_AUDIT_EVERY_S = 60.0

_lock = threading.Lock()
_refusals: Counter[tuple[str, str]] = Counter()


def admission_refusal_counts() -> dict[tuple[str, str], int]:
    """Refusals by this process since it started: (kind, setting) -> count.

    kind is `trigger`, `backfill` or `dataset_run`; setting names the limit that was hit.
    """
    with _lock:
        return dict(_refusals)


def count_refusal(kind: str, setting: str) -> None:
    """Add one refusal to this process's counts."""
    with _lock:
        _refusals[(kind, setting)] += 1


def find_overload_now(
    conn: Connection,
    limits: AdmissionLimits,
    *,
    dag_id: str,
    adding: Mapping[str, int],
    uncommitted: Sequence[Mapping[str, Any]] = (),
) -> Overload | None:
    """The limit `adding` (queue -> task instances) would exceed now, in the caller's transaction.

    `uncommitted`: task-instance rows the caller will insert before this work, counted as queued.
    The stored queued instances are counted up to the limit, so an overload's `queued` is at
    most the limit (plus the uncommitted ones).
    """
    if limits.is_off or not any(adding.values()):
        return None
    by_queue: Counter[str] = Counter()
    in_dag = 0
    for row in uncommitted:
        if row["state"] == TaskState.QUEUED.value:
            by_queue[row["queue"]] += 1
            in_dag += row["dag_id"] == dag_id
    # Counted up to the limit: past it the answer is the same, and the count stays cheap.
    if limits.per_queue > 0:
        for queue in sorted(q for q, n in adding.items() if n > 0):
            by_queue[queue] += admission_store.queued_in_queue(conn, queue, cap=limits.per_queue)
    if limits.per_dag > 0:
        in_dag += admission_store.queued_in_dag(conn, dag_id, cap=limits.per_dag)
    return find_overload(limits, dag_id=dag_id, adding=adding, queued_by_queue=by_queue, queued_in_dag=in_dag)


def require_admission(
    conn: Connection, limits: AdmissionLimits, *, dag_id: str, adding: Mapping[str, int], what: str
) -> None:
    """Raise Overloaded (naming the limit) when `adding` would exceed one; `what` opens the message."""
    found = find_overload_now(conn, limits, dag_id=dag_id, adding=adding)
    if found is not None:
        raise overloaded(found, what=what)


def overloaded(found: Overload, *, what: str) -> Overloaded:
    """The error for an overload."""
    return Overloaded(
        found.describe(what),
        setting=found.setting,
        limit=found.limit,
        scope=found.scope,
        name=found.name,
        queued=found.queued,
        adding=found.adding,
        retry_after_s=RETRY_AFTER_S,
    )


def record_refusal(
    db: Database, exc: Overloaded, *, kind: str, dag_id: str, actor: str, address: str | None = None
) -> None:
    """Audit (its own transaction, after the refused one rolled back) and count a refusal."""

    def work(conn: Connection) -> None:
        audit_refusal(conn, exc, kind=kind, dag_id=dag_id, actor=actor, address=address, at=db_now(conn))

    db.transact(work)
    count_refusal(kind, exc.setting)


def audit_refusal(
    conn: Connection,
    exc: Overloaded,
    *,
    kind: str,
    dag_id: str,
    actor: str,
    address: str | None,
    at: datetime,
) -> None:
    """Append the audit entry of one refusal in the caller's transaction."""
    audit.record(
        conn,
        at=at,
        actor=actor,
        action=REFUSED_ACTION,
        target=f"dag:{dag_id}",
        details={
            "kind": kind,
            "setting": exc.setting,
            "limit": exc.limit,
            "scope": exc.scope,
            "name": exc.name,
            "queued": exc.queued,
            "adding": exc.adding,
        },
        address=address,
    )


def is_dataset_refusal_audited(conn: Connection, dag_id: str, *, now: datetime) -> bool:
    """True when a refusal of this DAG was audited within the last DATASET_AUDIT_EVERY_S."""
    since = now - timedelta(seconds=DATASET_AUDIT_EVERY_S)
    return audit.count_recent(conn, action=REFUSED_ACTION, since=since, target=f"dag:{dag_id}") > 0
