"""Readiness: the database answers, its schema is the code's, and a scheduler leads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from treadle.engine.scheduling import LEADER_LEASE
from treadle.errors import TreadleError
from treadle.store import leases, revisions
from treadle.store.database import Database, db_now


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """One readiness check."""

    name: str
    ok: bool
    detail: str


def readiness(db: Database, *, scheduler_window_s: float) -> list[CheckResult]:
    """Every readiness check with its result; later checks are skipped when the database is down."""
    try:
        now = db.query(db_now, attempts=1)
    except TreadleError as exc:
        return [
            CheckResult(name="database", ok=False, detail=str(exc)),
            CheckResult(name="schema", ok=False, detail="not checked: the database is unreachable"),
            CheckResult(name="scheduler", ok=False, detail="not checked: the database is unreachable"),
        ]
    checks = [CheckResult(name="database", ok=True, detail="reachable")]
    current, head = revisions.current_revision(db), revisions.head_revision()
    checks.append(
        CheckResult(
            name="schema",
            ok=current == head,
            detail=f"at {current}" if current == head else f"at {current or 'nothing'}, code expects {head}",
        )
    )
    lease = db.query(lambda conn: leases.get(conn, LEADER_LEASE), attempts=1)
    # The renewal time, not the holder: a leader handing over gracefully leaves the row
    # without a holder for a moment, and that is no reason to be unready.
    seen = lease.renewed_at if lease is not None else None
    if seen is None:
        checks.append(CheckResult(name="scheduler", ok=False, detail="no scheduler has ever led"))
    else:
        age = (now - seen).total_seconds()
        fresh = now - seen <= timedelta(seconds=scheduler_window_s)
        checks.append(
            CheckResult(
                name="scheduler",
                ok=fresh,
                detail=f"the leader lease was renewed {age:.1f} s ago (allowed: {scheduler_window_s:g} s)",
            )
        )
    return checks
