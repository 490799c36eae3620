"""Backfill requests and operator actions: dry run, create, list, show, pause, unpause, cancel.

`plan_backfill` validates a request and shows what it would do (the dry run); `create_backfill`
validates the same way and records it (a `backfills` row plus an audit entry, one transaction).
Nothing here creates runs: the scheduler leader drains recorded backfills
(engine/backfill_drain.py); which intervals a request covers is decided in
domain/backfill_plan.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection

from treadle.domain.admission import NO_LIMITS, AdmissionLimits, queued_roots
from treadle.domain.backfill_plan import BackfillPlan, BackfillRange, check_options, check_range, dry_run
from treadle.domain.dag_version import DagStructure, DagVersion
from treadle.domain.params import resolve_params
from treadle.domain.records import DagInfo, RunInfo
from treadle.domain.states import RunState, RunType
from treadle.domain.timetable import ScheduleSpec
from treadle.engine.admission import record_refusal, require_admission
from treadle.engine.cancellation import cancel_run
from treadle.engine.queries import runs_for_operators
from treadle.engine.runs import require_run_allowed
from treadle.engine.versions import version_of
from treadle.errors import BackfillConflict, DagNotFound, InvalidRequest, Overloaded, ParamsInvalid
from treadle.store import audit, dialects
from treadle.store import backfills as backfill_store
from treadle.store import dags as dag_store
from treadle.store.backfills import BackfillInfo
from treadle.store.database import Database, db_now

__all__ = [
    "BackfillCancellation",
    "BackfillDetail",
    "BackfillStatus",
    "cancel_backfill",
    "create_backfill",
    "get_backfill",
    "list_backfills",
    "plan_backfill",
    "set_backfill_paused",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillStatus:
    """A backfill with the states of its runs."""

    backfill: BackfillInfo
    runs_success: int
    runs_failed: int
    runs_cancelled: int
    #: Queued or running.
    runs_active: int
    #: Intervals handled without a run of this backfill (a run already existed).
    skipped: int
    #: Handled intervals whose run is no longer active (or that were skipped).
    completed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillDetail:
    """A backfill, its counts and its runs (by logical date)."""

    status: BackfillStatus
    runs: list[RunInfo]


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillCancellation:
    """What cancelling a backfill did."""

    backfill_id: int
    #: False when it was already cancelled (its remaining runs are cancelled again).
    changed: bool
    runs_cancelled: list[str]


# -- request validation ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Checked:
    dag: DagInfo
    structure: DagStructure
    spec: ScheduleSpec
    reason: str
    range: BackfillRange


def _timed_spec(db: Database, conn: Connection, dag_id: str) -> tuple[DagInfo, DagVersion, ScheduleSpec]:
    dag = dag_store.get_dag(conn, dag_id)
    if dag is None or dag.latest_version_id is None:
        raise DagNotFound(f"no DAG {dag_id!r} is registered (run `treadle dags sync`?)")
    version = version_of(db, conn, dag.latest_version_id)
    require_run_allowed(version.structure, RunType.BACKFILL)
    spec = version.structure.schedule
    if spec is None or not spec.is_timed:
        what = "no schedule" if spec is None else f"a {spec.kind} schedule"
        raise InvalidRequest(
            f"DAG {dag_id!r} has {what}; a backfill needs a cron or interval schedule to define its intervals"
        )
    return dag, version, spec


def _check(
    db: Database,
    conn: Connection,
    dag_id: str,
    *,
    from_date: str | datetime,
    to_date: str | datetime,
    reason: str,
    max_active: int | None,
    mode: str,
    rerun: str,
    max_span_days: float,
    now: datetime,
) -> _Checked:
    """Validate a request (nothing is written); InvalidRequest or DagNotFound naming the problem."""
    text = check_options(reason=reason, mode=mode, rerun=rerun)
    dag, version, spec = _timed_spec(db, conn, dag_id)
    try:
        structure = version.structure
        resolve_params(dag_id, structure.params_schema, {}, rules=structure.param_rules)
    except ParamsInvalid as exc:
        raise InvalidRequest(f"backfill runs take the params' defaults, which are invalid: {exc}") from None
    checked = check_range(
        dag_id,
        spec,
        from_date=from_date,
        to_date=to_date,
        max_active=max_active,
        max_span_days=max_span_days,
        now=now,
    )
    return _Checked(dag=dag, structure=version.structure, spec=spec, reason=text, range=checked)


# -- create ----------------------------------------------------------------------------------------------


def plan_backfill(
    db: Database,
    dag_id: str,
    *,
    from_date: str | datetime,
    to_date: str | datetime,
    reason: str,
    max_active: int | None = None,
    mode: str = "normal",
    rerun: str = "none",
    max_span_days: float = 366.0,
) -> BackfillPlan:
    """Validate a backfill request and list its intervals with what would happen to each (dry run).

    Naive dates are read in the DAG's schedule time zone. Raises InvalidRequest or DagNotFound.
    """

    def work(conn: Connection) -> BackfillPlan:
        now = db_now(conn)
        c = _check(
            db,
            conn,
            dag_id,
            from_date=from_date,
            to_date=to_date,
            reason=reason,
            max_active=max_active,
            mode=mode,
            rerun=rerun,
            max_span_days=max_span_days,
            now=now,
        )
        logicals = [logical for logical, _ in c.range.intervals]
        return dry_run(
            dag_id,
            c.spec,
            checked=c.range,
            existing=backfill_store.interval_runs(conn, dag_id, logicals),
            reason=c.reason,
            mode=mode,
            rerun=rerun,
            dag_paused=c.dag.is_paused,
        )

    return db.query(work)


def create_backfill(
    db: Database,
    dag_id: str,
    *,
    from_date: str | datetime,
    to_date: str | datetime,
    reason: str,
    requested_by: str,
    max_active: int | None = None,
    mode: str = "normal",
    rerun: str = "none",
    max_span_days: float = 366.0,
    admission: AdmissionLimits = NO_LIMITS,
    address: str | None = None,
) -> BackfillInfo:
    """Validate a backfill request (as `plan_backfill`) and record it, with an audit entry.

    The backfill starts in state running at its first interval; the scheduler leader drains it.
    A backfill whose first wave (its first `max_active` runs, which the drain starts at once)
    would queue more task instances than an `admission` limit allows is refused with Overloaded
    (nothing recorded; the refusal audited as `admission.refused` and counted).
    """

    def work(conn: Connection) -> BackfillInfo:
        now = db_now(conn)
        c = _check(
            db,
            conn,
            dag_id,
            from_date=from_date,
            to_date=to_date,
            reason=reason,
            max_active=max_active,
            mode=mode,
            rerun=rerun,
            max_span_days=max_span_days,
            now=now,
        )
        r = c.range
        wave = min(r.max_active, len(r.intervals))
        require_admission(
            conn,
            admission,
            dag_id=dag_id,
            adding={q: n * wave for q, n in queued_roots(c.structure).items()},
            what=f"a backfill of DAG {dag_id!r} ({wave} run(s) at once)",
        )
        backfill_id = backfill_store.insert_backfill(
            conn,
            dag_id=dag_id,
            from_date=r.from_date,
            to_date=r.to_date,
            reason=c.reason,
            requested_by=requested_by[:250],
            mode=mode,
            rerun=rerun,
            max_active=r.max_active,
            state="running",
            total=len(r.intervals),
            handled=0,
            cursor=r.intervals[0][1],
            created_at=now,
            updated_at=now,
            ended_at=None,
        )
        audit.record(
            conn,
            at=now,
            actor=requested_by,
            action="backfill.create",
            target=f"backfill:{backfill_id}",
            details={
                "dag_id": dag_id,
                "from": r.from_date.isoformat(),
                "to": r.to_date.isoformat(),
                "reason": c.reason,
                "mode": mode,
                "rerun": rerun,
                "max_active": r.max_active,
                "total": len(r.intervals),
            },
            address=address,
        )
        found = backfill_store.get_backfill(conn, backfill_id)
        assert found is not None
        dialects.notify_scheduler(conn)  # an idle scheduler drains it at once
        return found

    try:
        return db.transact(work)
    except Overloaded as exc:
        record_refusal(db, exc, kind="backfill", dag_id=dag_id, actor=requested_by, address=address)
        raise


# -- views and operator actions --------------------------------------------------------------------------


def _status(b: BackfillInfo, counts: dict[str, int]) -> BackfillStatus:
    active = counts.get(RunState.QUEUED.value, 0) + counts.get(RunState.RUNNING.value, 0)
    runs = sum(counts.values())
    return BackfillStatus(
        backfill=b,
        runs_success=counts.get(RunState.SUCCESS.value, 0),
        runs_failed=counts.get(RunState.FAILED.value, 0),
        runs_cancelled=counts.get(RunState.CANCELLED.value, 0),
        runs_active=active,
        skipped=max(b.handled - runs, 0),
        completed=max(b.handled - active, 0),
    )


def list_backfills(db: Database, *, dag_id: str | None = None, limit: int = 100) -> list[BackfillStatus]:
    """The newest backfills (optionally of one DAG) with their run counts."""

    def work(conn: Connection) -> list[BackfillStatus]:
        found = backfill_store.list_backfills(conn, dag_id=dag_id, limit=limit)
        counts = backfill_store.run_state_counts(conn, [b.id for b in found])
        return [_status(b, counts.get(b.id, {})) for b in found]

    return db.query(work)


def get_backfill(db: Database, backfill_id: int) -> BackfillDetail:
    """One backfill with its run counts and runs. Raises InvalidRequest if there is none."""

    def work(conn: Connection) -> BackfillDetail:
        b = _get(conn, backfill_id)
        counts = backfill_store.run_state_counts(conn, [b.id])
        runs = backfill_store.runs_of(conn, b.id)
        return BackfillDetail(
            status=_status(b, counts.get(b.id, {})), runs=runs_for_operators(db, conn, runs)
        )

    return db.query(work)


def _get(conn: Connection, backfill_id: int, *, lock: bool = False) -> BackfillInfo:
    found = backfill_store.get_backfill(conn, backfill_id, lock=lock)
    if found is None:
        raise InvalidRequest(f"no backfill {backfill_id}")
    return found


def set_backfill_paused(
    db: Database, backfill_id: int, *, paused: bool, actor: str, address: str | None = None
) -> bool:
    """Pause (no new runs; active ones go on) or unpause a backfill; False if it already was so.

    Raises InvalidRequest for an unknown backfill or one that has ended (done or cancelled).
    """

    def work(conn: Connection) -> bool:
        b = _get(conn, backfill_id, lock=True)
        if b.state in ("done", "cancelled"):
            raise InvalidRequest(f"backfill {backfill_id} has ended ({b.state})")
        new, old = ("paused", "running") if paused else ("running", "paused")
        if b.state == new:
            return False
        now = db_now(conn)
        if not backfill_store.set_state(conn, backfill_id, expected=[old], new=new, now=now):
            raise BackfillConflict(backfill_id=backfill_id, dag_id=b.dag_id)
        audit.record(
            conn,
            at=now,
            actor=actor,
            action="backfill.pause" if paused else "backfill.unpause",
            target=f"backfill:{backfill_id}",
            address=address,
        )
        if not paused:
            dialects.notify_scheduler(conn)
        return True

    return db.transact(work)


def cancel_backfill(
    db: Database, backfill_id: int, *, actor: str, reason: str = "", address: str | None = None
) -> BackfillCancellation:
    """Cancel a backfill (no new runs), then cancel its queued and running runs.

    The backfill is cancelled first, in its own transaction, so the drain starts nothing more;
    each run is then cancelled through the cancellation engine. Cancelling an already cancelled
    backfill cancels whatever of its runs is still active. Raises InvalidRequest for an unknown
    backfill or one that is done.
    """

    def work(conn: Connection) -> bool:
        b = _get(conn, backfill_id, lock=True)
        if b.state == "done":
            raise InvalidRequest(f"backfill {backfill_id} is already done")
        if b.state == "cancelled":
            return False
        now = db_now(conn)
        if not backfill_store.set_state(conn, backfill_id, expected=[b.state], new="cancelled", now=now):
            raise BackfillConflict(backfill_id=backfill_id, dag_id=b.dag_id)
        audit.record(
            conn,
            at=now,
            actor=actor,
            action="backfill.cancel",
            target=f"backfill:{backfill_id}",
            details={"reason": reason},
            address=address,
        )
        return True

    changed = db.transact(work)
    active = db.query(lambda conn: backfill_store.runs_of(conn, backfill_id, active_only=True))
    cancelled = []
    for run in active:
        try:
            cancel_run(
                db,
                run.run_id,
                actor=actor,
                reason=f"backfill {backfill_id} cancelled" + (f": {reason}" if reason else ""),
            )
        except InvalidRequest:
            continue  # it ended meanwhile
        cancelled.append(run.run_id)
    return BackfillCancellation(backfill_id=backfill_id, changed=changed, runs_cancelled=cancelled)
