"""Backfills: run a DAG over a range of past schedule intervals, drained by the scheduler leader.

`plan_backfill` validates a request and shows what it would do (the dry run); `create_backfill`
validates the same way and records it (a `backfills` row plus an audit entry, one transaction).
The leader calls `drain_backfills` every tick: in one transaction fenced by the leader lease
it hands each running backfill of an unpaused DAG its next intervals, oldest first, up to the
backfill's own `max_active` active runs: a new backfill run, a rerun of the interval's existing
run (cleared and counted against the backfill), or a skip. Backfill runs count only against
their backfill's budget, never against the DAG's `max_active_runs` (the scheduler counts only
scheduled runs), so a large backfill does not hold up live scheduled runs.

An interval is one schedule slot: its logical date is the data interval start; the range
[from, to] (inclusive) selects slots by logical date. Only intervals that have ended are
included (the scheduler runs the others), and only within the DAG's start/end dates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion
from treadle.domain.params import resolve_params
from treadle.domain.records import DagInfo, RunInfo
from treadle.domain.states import TERMINAL_RUN_STATES, RunState, RunType
from treadle.domain.timetable import ScheduleSpec, Timetable
from treadle.engine.cancellation import cancel_run
from treadle.engine.clearing import clear_in_transaction
from treadle.engine.dags import version_of
from treadle.engine.runs import new_run
from treadle.engine.schedules import fires_of
from treadle.engine.scheduling import LEADER_LEASE
from treadle.errors import BackfillConflict, DagNotFound, InvalidRequest, NotLeader, ParamsInvalid
from treadle.store import audit, dialects
from treadle.store import backfills as backfill_store
from treadle.store import dags as dag_store
from treadle.store import leases as lease_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.backfills import BackfillInfo
from treadle.store.database import Database, db_now

__all__ = [
    "BackfillCancellation",
    "BackfillDetail",
    "BackfillInfo",
    "BackfillPlan",
    "BackfillStatus",
    "PlannedInterval",
    "cancel_backfill",
    "create_backfill",
    "drain_backfills",
    "get_backfill",
    "list_backfills",
    "plan_backfill",
    "set_backfill_paused",
]

log = logging.getLogger("treadle.scheduler")

#: Most intervals one backfill may cover.
MAX_INTERVALS = 10_000
#: Longest reason kept (it is shown in listings and the audit log).
MAX_REASON_CHARS = 2_000
#: Most intervals one backfill looks at in one drain pass (skips included).
MAX_SCAN_PER_PASS = 500
MODES = ("normal", "shadow")
RERUNS = ("none", "failed", "all")
#: Actions on an interval (the dry run shows them; the drain applies them).
CREATE, SKIP_EXISTING, SKIP_ACTIVE, RERUN_FAILED, RERUN_ALL = (
    "create",
    "skip existing",
    "skip active",
    "rerun failed",
    "rerun all",
)
_US = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedInterval:
    """One interval of a backfill and what would happen to it now."""

    logical_date: datetime
    data_interval_start: datetime
    data_interval_end: datetime
    fire_at: datetime
    #: create, skip existing, skip active, rerun failed or rerun all.
    action: str
    existing_run_id: str | None = None
    existing_run_type: str | None = None
    existing_state: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillPlan:
    """What a backfill request covers (the dry run): nothing is recorded."""

    dag_id: str
    timezone: str
    from_date: datetime
    to_date: datetime
    reason: str
    mode: str
    rerun: str
    max_active: int
    dag_paused: bool
    #: True when the range reaches intervals that have not ended yet (left to the scheduler).
    open_intervals_left_out: bool
    intervals: list[PlannedInterval]
    #: Intervals per action.
    actions: dict[str, int]

    @property
    def total(self) -> int:
        """How many intervals the backfill covers."""
        return len(self.intervals)


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
    spec: ScheduleSpec
    table: Timetable
    from_date: datetime
    to_date: datetime
    max_active: int
    reason: str
    #: (logical date, fire time) of every interval, oldest first.
    intervals: list[tuple[datetime, datetime]]
    open_left_out: bool


def read_date(value: str | datetime, zone: ZoneInfo, what: str) -> datetime:
    """An ISO date or date-time as UTC; a date or a time without offset is read in `zone`."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidRequest(f"{what} {value!r} is not an ISO-8601 date or date-time") from None
    else:
        parsed = value
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        parsed = parsed.replace(tzinfo=zone)
    return parsed.astimezone(UTC)


def _check_options(reason: str, mode: str, rerun: str) -> str:
    """The stripped reason; InvalidRequest for a blank one or an unknown mode or rerun."""
    text = (reason or "").strip()
    if not text:
        raise InvalidRequest("a backfill needs a reason (--reason TEXT): say why these intervals run again")
    if len(text) > MAX_REASON_CHARS:
        raise InvalidRequest(f"the reason is longer than the limit of {MAX_REASON_CHARS} characters")
    if mode not in MODES:
        raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if rerun not in RERUNS:
        raise InvalidRequest(f"rerun must be one of {', '.join(RERUNS)}, got {rerun!r}")
    return text


def _timed_spec(db: Database, conn: Connection, dag_id: str) -> tuple[DagInfo, DagVersion, ScheduleSpec]:
    dag = dag_store.get_dag(conn, dag_id)
    if dag is None or dag.latest_version_id is None:
        raise DagNotFound(f"no DAG {dag_id!r} is registered (run `treadle dags sync`?)")
    version = version_of(db, conn, dag.latest_version_id)
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
    text = _check_options(reason, mode, rerun)
    dag, version, spec = _timed_spec(db, conn, dag_id)
    try:
        resolve_params(dag_id, version.structure.params_schema, {})
    except ParamsInvalid as exc:
        raise InvalidRequest(f"backfill runs take the params' defaults, which are invalid: {exc}") from None
    zone = ZoneInfo(spec.timezone)
    start = read_date(from_date, zone, "--from")
    end = read_date(to_date, zone, "--to")
    if start > end:
        raise InvalidRequest(f"--from {start.isoformat()} is after --to {end.isoformat()}")
    span_days = (end - start) / timedelta(days=1)
    if span_days > max_span_days:
        raise InvalidRequest(
            f"the range spans {span_days:.1f} days, more than the limit of {max_span_days:g} days "
            "(setting TREADLE_BACKFILL_MAX_SPAN_DAYS)"
        )
    limit = spec.max_active_runs
    active = limit if max_active is None else max_active
    if not 1 <= active <= limit:
        raise InvalidRequest(
            f"--max-active must be between 1 and the DAG's max_active_runs ({limit}), got {active}"
        )
    table = Timetable(spec)
    intervals, open_left_out = _intervals(table, spec, start, end, now)
    if not intervals:
        raise InvalidRequest(_empty_message(dag_id, spec, start, end, open_left_out))
    if len(intervals) > MAX_INTERVALS:
        raise InvalidRequest(
            f"the range holds more than {MAX_INTERVALS} intervals, the most one backfill may cover; "
            "split it into smaller backfills"
        )
    return _Checked(
        dag=dag,
        spec=spec,
        table=table,
        from_date=start,
        to_date=end,
        max_active=active,
        reason=text,
        intervals=intervals,
        open_left_out=open_left_out,
    )


def _intervals(
    table: Timetable, spec: ScheduleSpec, start: datetime, end: datetime, now: datetime
) -> tuple[list[tuple[datetime, datetime]], bool]:
    """(logical date, fire time) of the ended intervals whose logical date is in [start, end],
    within the DAG's start/end dates, at most MAX_INTERVALS + 1; and whether ones were left open."""
    if spec.start_date is not None:
        start = max(start, spec.start_date)
    if spec.end_date is not None:
        end = min(end, spec.end_date)
    found: list[tuple[datetime, datetime]] = []
    if start > end:
        return found, False
    logical = table.next_fire_after(start - _US)
    while logical <= end and len(found) <= MAX_INTERVALS:
        fire = table.next_fire_after(logical)
        if fire > now:
            return found, True
        found.append((logical, fire))
        logical = fire
    return found, False


def _empty_message(dag_id: str, spec: ScheduleSpec, start: datetime, end: datetime, open_left: bool) -> str:
    msg = (
        f"no interval of DAG {dag_id!r} has its logical date between {start.isoformat()} "
        f"and {end.isoformat()}"
    )
    if open_left:
        msg += " and has ended (intervals still open are run by the scheduler)"
    if spec.start_date is not None and end < spec.start_date:
        msg += f"; its schedule starts at {spec.start_date.isoformat()}"
    if spec.end_date is not None and start > spec.end_date:
        msg += f"; its schedule ends at {spec.end_date.isoformat()}"
    return msg


def _action(rerun: str, existing: RunInfo | None) -> str:
    """What a backfill does with an interval whose newest run is `existing`."""
    if existing is None:
        return CREATE
    if rerun == "failed" and existing.state == RunState.FAILED.value:
        return RERUN_FAILED
    if rerun == "all":
        return RERUN_ALL if existing.state in TERMINAL_RUN_STATES else SKIP_ACTIVE
    return SKIP_EXISTING


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
        existing = backfill_store.interval_runs(conn, dag_id, [logical for logical, _ in c.intervals])
        planned = []
        actions: dict[str, int] = {}
        for logical, fire in c.intervals:
            run = existing.get(logical)
            action = _action(rerun, run)
            actions[action] = actions.get(action, 0) + 1
            planned.append(
                PlannedInterval(
                    logical_date=logical,
                    data_interval_start=logical,
                    data_interval_end=fire,
                    fire_at=fire,
                    action=action,
                    existing_run_id=run.run_id if run else None,
                    existing_run_type=run.run_type if run else None,
                    existing_state=run.state if run else None,
                )
            )
        return BackfillPlan(
            dag_id=dag_id,
            timezone=c.spec.timezone,
            from_date=c.from_date,
            to_date=c.to_date,
            reason=c.reason,
            mode=mode,
            rerun=rerun,
            max_active=c.max_active,
            dag_paused=c.dag.is_paused,
            open_intervals_left_out=c.open_left_out,
            intervals=planned,
            actions=actions,
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
) -> BackfillInfo:
    """Validate a backfill request (as `plan_backfill`) and record it, with an audit entry.

    The backfill starts in state running at its first interval; the scheduler leader drains it.
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
        backfill_id = backfill_store.insert_backfill(
            conn,
            dag_id=dag_id,
            from_date=c.from_date,
            to_date=c.to_date,
            reason=c.reason,
            requested_by=requested_by[:250],
            mode=mode,
            rerun=rerun,
            max_active=c.max_active,
            state="running",
            total=len(c.intervals),
            handled=0,
            cursor=c.intervals[0][1],
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
                "from": c.from_date.isoformat(),
                "to": c.to_date.isoformat(),
                "reason": c.reason,
                "mode": mode,
                "rerun": rerun,
                "max_active": c.max_active,
                "total": len(c.intervals),
            },
        )
        found = backfill_store.get_backfill(conn, backfill_id)
        assert found is not None
        return found

    return db.transact(work)


# -- drain (scheduler leader) ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Pass:
    """What one drain pass builds up: new runs and their task instances."""

    runs: list[RunInfo] = field(default_factory=list)
    instances: list[dict[str, Any]] = field(default_factory=list)
    reopened: bool = False
    handled: int = 0


@dataclass(frozen=True, slots=True)
class _Ready:
    """What creating runs of a backfill's DAG needs: its latest version, timetable and params."""

    version: DagVersion
    table: Timetable
    params: dict[str, Any]  # Any: JSON


def drain_backfills(db: Database, *, holder: str, epoch: int, default_queue_timeout_s: float) -> int:
    """Hand every running backfill its next intervals, in one transaction fenced by the leader lease.

    Raises NotLeader when `holder` no longer leads at `epoch` (nothing is written). Returns how
    many intervals were handled (runs created, runs reopened, intervals skipped).
    """

    def work(conn: Connection) -> int:
        now = db_now(conn)
        if not lease_store.hold(conn, LEADER_LEASE, holder=holder, epoch=epoch, now=now):
            raise NotLeader(holder=holder, epoch=epoch)
        running = backfill_store.lock_running(conn)
        if not running:
            return 0
        active = backfill_store.active_run_counts(conn, [b.id for b in running])
        acc = _Pass()
        for b in running:
            _drain_one(
                db, conn, b, active.get(b.id, 0), acc, epoch=epoch, now=now, qt=default_queue_timeout_s
            )
        if acc.runs:
            run_store.insert_runs(conn, acc.runs)
            ti_store.insert_task_instances(conn, acc.instances)
        if acc.runs or acc.reopened:
            dialects.notify_ready(conn)
        return acc.handled

    return db.transact(work)


def _drain_one(
    db: Database,
    conn: Connection,
    b: BackfillInfo,
    active: int,
    acc: _Pass,
    *,
    epoch: int,
    now: datetime,
    qt: float,
) -> None:
    """Handle the next intervals of one backfill; its cursor and count move by compare-and-set.

    A backfill whose intervals are all handled and whose runs have all ended is done.
    """
    started = 0
    cursor = b.cursor
    if cursor is not None:
        step = _step(db, conn, b, active, acc, epoch=epoch, now=now, qt=qt)
        if step is None:
            return
        taken, started, cursor = step
        acc.handled += taken
        moved = (cursor, taken) != (b.cursor, 0)
        if moved and not backfill_store.advance(
            conn,
            b.id,
            expected_cursor=b.cursor,
            expected_handled=b.handled,
            cursor=cursor,
            handled=b.handled + taken,
            now=now,
        ):
            raise BackfillConflict(
                f"backfill {b.id} changed during the drain pass", backfill_id=b.id, dag_id=b.dag_id
            )
    done = cursor is None and active + started == 0
    if done and backfill_store.set_state(conn, b.id, expected=["running"], new="done", now=now):
        log.info("backfill done", extra={"event": "backfill.done", "backfill_id": b.id, "dag_id": b.dag_id})


def _step(
    db: Database,
    conn: Connection,
    b: BackfillInfo,
    active: int,
    acc: _Pass,
    *,
    epoch: int,
    now: datetime,
    qt: float,
) -> tuple[int, int, datetime | None] | None:
    """(intervals handled, runs started, new cursor) of one backfill; None while its DAG is paused."""
    dag = dag_store.get_dag(conn, b.dag_id)
    if dag is not None and dag.is_paused:
        return None
    ready = _ready(db, conn, b, dag, now=now)
    if ready is None:
        return None
    room = b.max_active - active
    if room <= 0:
        return 0, 0, b.cursor
    candidates, after = _candidates(ready.table, b, now=now)
    existing = backfill_store.interval_runs(conn, b.dag_id, [logical for logical, _ in candidates])
    taken = started = 0
    for logical, fire in candidates:
        action = _action(b.rerun, existing.get(logical))
        if action in (CREATE, RERUN_FAILED, RERUN_ALL) and started >= room:
            break
        if action == CREATE:
            _create(ready, b, logical, fire, acc, epoch=epoch, now=now, qt=qt)
            started += 1
        elif action in (RERUN_FAILED, RERUN_ALL) and _rerun(db, conn, b, existing[logical], action):
            acc.reopened = True
            started += 1
        taken += 1
    cursor = candidates[taken][1] if taken < len(candidates) else after
    return taken, started, cursor


def _candidates(
    table: Timetable, b: BackfillInfo, *, now: datetime
) -> tuple[list[tuple[datetime, datetime]], datetime | None]:
    """The next intervals (logical date, fire time) of a backfill from its cursor, looking at
    most MAX_SCAN_PER_PASS ahead, and the fire time after the last one looked at (None: no more)."""
    assert b.cursor is not None
    spec = table.spec
    out: list[tuple[datetime, datetime]] = []
    fire = table.next_fire_after(b.cursor - _US)  # the cursor itself when it is a fire time
    logical = table.prev_fire_before(fire)
    remaining = b.total - b.handled
    for _ in range(MAX_SCAN_PER_PASS):
        if len(out) >= remaining or (logical is not None and logical > b.to_date):
            return out, None
        if fire > now:
            return out, fire  # not ended yet (the schedule changed since): wait for it
        if logical is not None and _within(spec, logical):
            out.append((logical, fire))
        logical, fire = fire, table.next_fire_after(fire)
    return out, fire


def _within(spec: ScheduleSpec, logical: datetime) -> bool:
    """True if a logical date is within the DAG's start and end dates."""
    return (spec.start_date is None or logical >= spec.start_date) and (
        spec.end_date is None or logical <= spec.end_date
    )


def _ready(
    db: Database, conn: Connection, b: BackfillInfo, dag: DagInfo | None, *, now: datetime
) -> _Ready | None:
    """The DAG's latest version, timetable and default params; pauses the backfill (None) if
    the DAG is gone, has no timed schedule any more, or its params have no valid defaults."""
    problem = None
    if dag is None or dag.latest_version_id is None:
        problem = f"DAG {b.dag_id!r} is no longer registered"
    else:
        version = version_of(db, conn, dag.latest_version_id)
        spec = version.structure.schedule
        if spec is None or not spec.is_timed:
            problem = f"DAG {b.dag_id!r} no longer has a cron or interval schedule"
        else:
            try:
                params = resolve_params(b.dag_id, version.structure.params_schema, {})
            except ParamsInvalid as exc:
                problem = f"the params of DAG {b.dag_id!r} have no valid defaults: {exc}"
            else:
                return _Ready(version=version, table=fires_of(spec).table, params=params)
    if backfill_store.set_state(conn, b.id, expected=["running"], new="paused", now=now):
        audit.record(
            conn,
            at=now,
            actor="scheduler",
            action="backfill.pause",
            target=f"backfill:{b.id}",
            details={"reason": problem},
        )
        log.warning(
            "backfill paused", extra={"event": "backfill.paused", "backfill_id": b.id, "reason": problem}
        )
    return None


def _create(
    ready: _Ready,
    b: BackfillInfo,
    logical: datetime,
    fire: datetime,
    acc: _Pass,
    *,
    epoch: int,
    now: datetime,
    qt: float,
) -> None:
    """A new backfill run of one interval (inserted with the pass's other runs)."""
    run, rows = new_run(
        ready.version,
        run_type=RunType.BACKFILL,
        logical_date=logical,
        data_interval=(logical, fire),
        conf={},
        params=ready.params,
        triggered_by=f"backfill:{b.id}:{b.requested_by}"[:250],
        now=now,
        default_queue_timeout_s=qt,
        mode=b.mode,
        backfill_id=b.id,
        leader_epoch=epoch,
    )
    acc.runs.append(run)
    acc.instances.extend(rows)


def _rerun(db: Database, conn: Connection, b: BackfillInfo, run: RunInfo, action: str) -> bool:
    """Clear an interval's existing run (its failed tasks, or all) and count it against `b`.

    False (the interval is skipped) when the run cannot be cleared as it stands.
    """
    try:
        cleared = clear_in_transaction(
            db,
            conn,
            run.run_id,
            task_ids=None,
            downstream=True,
            only_failed=action == RERUN_FAILED,
            actor=f"backfill:{b.id}:{b.requested_by}",
            reason=f"backfill {b.id} ({action}): {b.reason}",
        )
    except InvalidRequest as exc:  # raised before anything is written
        log.warning(
            "backfill interval skipped: run cannot be cleared",
            extra={
                "event": "backfill.rerun_skipped",
                "backfill_id": b.id,
                "run_id": run.run_id,
                "error": str(exc),
            },
        )
        return False
    if not cleared:
        return False
    backfill_store.adopt_run(conn, run.run_id, b.id)
    return True


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
        return BackfillDetail(
            status=_status(b, counts.get(b.id, {})), runs=backfill_store.runs_of(conn, b.id)
        )

    return db.query(work)


def _get(conn: Connection, backfill_id: int, *, lock: bool = False) -> BackfillInfo:
    found = backfill_store.get_backfill(conn, backfill_id, lock=lock)
    if found is None:
        raise InvalidRequest(f"no backfill {backfill_id}")
    return found


def set_backfill_paused(db: Database, backfill_id: int, *, paused: bool, actor: str) -> bool:
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
        )
        return True

    return db.transact(work)


def cancel_backfill(db: Database, backfill_id: int, *, actor: str, reason: str = "") -> BackfillCancellation:
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
