"""Time-based run creation: schedules' watermarks, catch-up policy and max_active_runs.

Only the leader fires (engine/leadership.py). Every firing transaction first locks the leader
lease row and checks the caller's epoch (F10): a leader that lost its lease while paused can
write nothing. Each schedule's durable watermark (`last_fire_at`, `next_fire_at`) moves by
compare-and-set in the same transaction as the runs it creates (F9), and the unique key
(dag_id, logical_date, run_type) on runs is the last line: a slot that already has a run is
skipped, never fired twice. Fire times come from the database clock only (F12).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagVersion
from treadle.domain.durations import DEFAULT_TASK_TIMEOUT_S
from treadle.domain.params import resolve_params
from treadle.domain.records import RunInfo
from treadle.domain.states import RunType
from treadle.engine import lineage
from treadle.engine.runs import new_run
from treadle.engine.schedules import fires_of
from treadle.engine.versions import versions_of
from treadle.errors import NotLeader, ParamsInvalid, WatermarkMoved
from treadle.store import dialects
from treadle.store import leases as lease_store
from treadle.store import runs as run_store
from treadle.store import schedules as schedule_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

log = logging.getLogger("treadle.scheduler")

#: Name of the lease that elects the scheduler leader.
LEADER_LEASE = "scheduler"
#: Most runs one schedule gets in one pass (catch-up drains over several passes).
MAX_RUNS_PER_SCHEDULE_PASS = 100
#: Identity recorded as `triggered_by` on runs the scheduler creates.
SCHEDULER_IDENTITY = "scheduler"


@dataclass(slots=True)
class FireReport:
    """What one firing pass did."""

    runs_created: int = 0
    #: Slots passed over by policy (catchup off) or because a run for them already existed.
    slots_skipped: int = 0
    #: Schedules due but held back by max_active_runs.
    blocked: int = 0
    #: Schedules looked at (a full batch means more may be due).
    examined: int = 0
    created: list[RunInfo] = field(default_factory=list)
    #: Database time the pass looked for due schedules at: later fire times are not handled yet.
    now: datetime | None = None


def fire_due_schedules(
    db: Database,
    *,
    holder: str,
    epoch: int,
    default_queue_timeout_s: float,
    limit: int = 500,
    default_task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S,
) -> FireReport:
    """Create the runs of every due slot of up to `limit` schedules, in one fenced transaction."""

    def work(conn: Connection) -> FireReport:
        now = db_now(conn)
        if not lease_store.hold(conn, LEADER_LEASE, holder=holder, epoch=epoch, now=now):
            raise NotLeader(holder=holder, epoch=epoch)
        report = FireReport(now=now)
        due = schedule_store.due(conn, now=now, limit=limit)
        report.examined = len(due)
        if not due:
            return report
        active = schedule_store.active_run_counts(conn, [s.dag_id for s in due], run_type=RunType.SCHEDULED)
        versions = versions_of(db, conn, [s.latest_version_id for s in due])
        plans = []
        for row in due:
            version = versions[row.latest_version_id]
            if version.structure.schedule is None or not version.structure.schedule.is_timed:
                continue  # re-registered without a timed schedule since: its row says so next pass
            plan = _plan(row, version, active.get(row.dag_id, 0), now=now)
            report.slots_skipped += plan.skipped
            if plan.blocked:
                report.blocked += 1
            elif plan.fires or plan.next_fire_at != row.next_fire_at:
                plans.append(plan)
        runs, instances = _build_runs(
            db,
            conn,
            plans,
            report,
            epoch=epoch,
            now=now,
            queue_timeout_s=default_queue_timeout_s,
            task_timeout_s=default_task_timeout_s,
        )
        moves = [(p.row.dag_id, p.row.next_fire_at, p.last_fire_at, p.next_fire_at) for p in plans]
        moved = schedule_store.advance(conn, moves, now=now)
        if moved != len(moves):
            raise WatermarkMoved(dag_ids=[m[0] for m in moves], expected=len(moves), moved=moved)
        if runs:
            run_store.insert_runs(conn, runs)
            lineage.runs_started(db, conn, runs)
            ti_store.insert_task_instances(conn, instances)
            dialects.notify_ready(conn)
        report.runs_created = len(runs)
        report.created = runs
        return report

    return db.transact(work, retry_conflicts=True)


def _build_runs(
    db: Database,
    conn: Connection,
    plans: list[_Plan],
    report: FireReport,
    *,
    epoch: int,
    now: datetime,
    queue_timeout_s: float,
    task_timeout_s: float | None,
) -> tuple[list[RunInfo], list[dict[str, Any]]]:
    """The runs (and task instances) of the planned slots that have no scheduled run yet."""
    wanted = [(p.row.dag_id, start) for p in plans for _, start in p.fires]
    # A slot a backfill already ran (say while the DAG was paused) is not run again.
    exists = schedule_store.existing_logical_dates(
        conn, wanted, run_types=[RunType.SCHEDULED, RunType.BACKFILL]
    )
    runs: list[RunInfo] = []
    instances: list[dict[str, Any]] = []
    versions = versions_of(
        db, conn, [p.row.latest_version_id for p in plans if p.fires and p.row.latest_version_id]
    )
    defaults: dict[int, dict[str, Any] | None] = {}
    for plan in plans:
        if not plan.fires:
            continue
        assert plan.row.latest_version_id is not None
        version = versions[plan.row.latest_version_id]
        if version.id not in defaults:
            try:
                structure = version.structure
                defaults[version.id] = resolve_params(
                    plan.row.dag_id, structure.params_schema, {}, rules=structure.param_rules
                )
            except ParamsInvalid as exc:
                log.error(
                    "scheduled run not created: params have no valid defaults",
                    extra={"event": "scheduler.params_invalid", "dag_id": plan.row.dag_id, "error": str(exc)},
                )
                defaults[version.id] = None
        params = defaults[version.id]
        if params is None:
            report.slots_skipped += len(plan.fires)
            continue
        for fire, start in plan.fires:
            if (plan.row.dag_id, start) in exists:
                report.slots_skipped += 1
                continue
            run, rows = new_run(
                version,
                run_type=RunType.SCHEDULED,
                logical_date=start,
                data_interval=(start, fire),
                conf={},
                params=dict(params),
                triggered_by=SCHEDULER_IDENTITY,
                now=now,
                default_queue_timeout_s=queue_timeout_s,
                default_task_timeout_s=task_timeout_s,
                leader_epoch=epoch,
            )
            runs.append(run)
            instances.extend(rows)
    return runs, instances


@dataclass(slots=True)
class _Plan:
    row: schedule_store.DueRow
    version: DagVersion
    #: Due slots that get runs: (fire time, data interval start), oldest first.
    fires: list[tuple[datetime, datetime]]
    last_fire_at: datetime | None
    next_fire_at: datetime | None
    skipped: int = 0
    blocked: bool = False


def _plan(row: schedule_store.DueRow, version: DagVersion, active: int, *, now: datetime) -> _Plan:
    """Which slots of one due schedule get runs now, and where its watermark moves.

    Fire times are consecutive, so the data interval of the fire after `f` starts at `f`:
    one next-fire and one previous-fire lookup per slot.
    """
    spec = version.structure.schedule
    assert spec is not None
    fires = fires_of(spec)
    first = row.next_fire_at
    plan = _Plan(row, version, [], row.last_fire_at, first)
    room = spec.max_active_runs - active
    following = fires.next_after(first)
    if not spec.catchup and following <= now:
        # Catch-up off: only the newest due slot runs; the ones before it are passed over.
        latest = fires.table.latest_fire_at_or_before(now)
        if latest is not None and latest > first:
            passed = fires.table.fires(first, until=latest, limit=10_000)
            plan.skipped = len(passed)  # `first` itself is passed over, `latest` is in the list
            log.info(
                "slots passed over (catchup off)",
                extra={
                    "event": "scheduler.slots_skipped",
                    "dag_id": row.dag_id,
                    "from": first.isoformat(),
                    "until": latest.isoformat(),
                    "count": plan.skipped,
                },
            )
            first = latest
            following = fires.next_after(first)
    if room <= 0:
        # Held back: the watermark moves past passed-over slots only, never past `first`.
        plan.blocked = plan.skipped == 0
        if plan.skipped:
            plan.last_fire_at = fires.prev_before(first)
            plan.next_fire_at = first
        return plan
    take = min(room, MAX_RUNS_PER_SCHEDULE_PASS) if spec.catchup else 1
    fire, start = first, fires.prev_before(first)
    while True:
        if not fires.logical_ok(start):
            # Past end_date (or before start_date): nothing more will ever fire.
            plan.next_fire_at = None
            break
        assert start is not None
        plan.fires.append((fire, start))
        plan.last_fire_at = fire
        nxt = following if fire == first else fires.next_after(fire)
        plan.next_fire_at = nxt
        if len(plan.fires) >= take or nxt > now:
            if not fires.logical_ok(fire):  # the next slot's interval starts at `fire`
                plan.next_fire_at = None
            break
        fire, start = nxt, fire
    return plan


def next_wakeup(db: Database, *, handled_until: datetime | None) -> tuple[datetime, datetime | None]:
    """The database's now and the earliest fire time of an unpaused schedule after
    `handled_until` (the time the last firing pass looked at; default now).

    A slot that fell due while the pass ran is after `handled_until` and at or before now: the
    caller wakes at once instead of sleeping past it.
    """

    def work(conn: Connection) -> tuple[datetime, datetime | None]:
        now = db_now(conn)
        return now, schedule_store.next_wakeup(conn, after=handled_until or now)

    return db.query(work)


def prefetch_versions(db: Database, *, within_s: float) -> int:
    """Load (into the version cache) the DAG versions of schedules due within `within_s`.

    Done while the leader waits, so a burst of first fires does not parse structures on the
    clock. Returns how many versions were read.
    """

    def work(conn: Connection) -> int:
        wanted = schedule_store.version_ids_due_by(conn, until=db_now(conn) + timedelta(seconds=within_s))
        missing = [v for v in wanted if v not in db.version_cache]
        if missing:
            versions_of(db, conn, missing)
        return len(missing)

    return db.query(work)
