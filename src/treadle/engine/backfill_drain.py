"""The leader's backfill drain: each tick, hand every running backfill its next intervals.

In one transaction fenced by the leader lease, each running backfill of an unpaused DAG gets its
next intervals, oldest first, up to the backfill's own `max_active` active runs: a new backfill
run, a rerun of the interval's existing run (cleared and counted against the backfill), or a
skip. Backfill runs count only against their backfill's budget, never against the DAG's
`max_active_runs` (the scheduler counts only scheduled runs), so a large backfill does not hold
up live scheduled runs. Which intervals and what to do with each is decided in
domain/backfill_plan.py; requests are recorded by engine/backfill_actions.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.admission import NO_LIMITS, AdmissionLimits, queued_roots
from treadle.domain.backfill_plan import (
    CREATE,
    RERUN_ALL,
    RERUN_FAILED,
    STARTS_RUN,
    Interval,
    interval_action,
    next_intervals,
)
from treadle.domain.dag_version import DagVersion
from treadle.domain.durations import DEFAULT_TASK_TIMEOUT_S
from treadle.domain.params import resolve_params
from treadle.domain.records import DagInfo, RunInfo
from treadle.domain.states import RunType
from treadle.domain.timetable import Timetable
from treadle.engine import lineage
from treadle.engine.admission import count_refusal, find_overload_now
from treadle.engine.clearing import clear_in_transaction
from treadle.engine.runs import new_run
from treadle.engine.schedules import fires_of
from treadle.engine.scheduling import LEADER_LEASE
from treadle.engine.versions import version_of
from treadle.errors import BackfillConflict, InvalidRequest, NotLeader, ParamsInvalid
from treadle.store import audit, dialects
from treadle.store import backfills as backfill_store
from treadle.store import dags as dag_store
from treadle.store import leases as lease_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.backfills import BackfillInfo
from treadle.store.database import Database, db_now

__all__ = ["drain_backfills"]

log = logging.getLogger("treadle.scheduler")


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


def drain_backfills(
    db: Database,
    *,
    holder: str,
    epoch: int,
    default_queue_timeout_s: float,
    default_task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S,
    admission: AdmissionLimits = NO_LIMITS,
) -> int:
    """Hand every running backfill its next intervals, in one transaction fenced by the leader lease.

    A run that would bring a queue or the DAG past an `admission` limit is not started: the
    backfill stops there for this pass (the interval stays its next) and the hold-back is
    counted (`backfill_drain`); live work is never crowded out by a backfill's queue.
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
                db,
                conn,
                b,
                active.get(b.id, 0),
                acc,
                epoch=epoch,
                now=now,
                qt=default_queue_timeout_s,
                tt=default_task_timeout_s,
                admission=admission,
            )
        if acc.runs:
            run_store.insert_runs(conn, acc.runs)
            lineage.runs_started(db, conn, acc.runs)
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
    tt: float | None,
    admission: AdmissionLimits,
) -> None:
    """Handle the next intervals of one backfill; its cursor and count move by compare-and-set.

    A backfill whose intervals are all handled and whose runs have all ended is done.
    """
    started = 0
    cursor = b.cursor
    if cursor is not None:
        step = _step(db, conn, b, active, acc, epoch=epoch, now=now, qt=qt, tt=tt, admission=admission)
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
    tt: float | None,
    admission: AdmissionLimits,
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
        action = interval_action(b.rerun, existing.get(logical))
        if action in STARTS_RUN and (started >= room or _held_back(conn, admission, b, ready, acc)):
            break
        if action == CREATE:
            _create(ready, b, logical, fire, acc, epoch=epoch, now=now, qt=qt, tt=tt)
            started += 1
        elif action in (RERUN_FAILED, RERUN_ALL) and _rerun(db, conn, b, existing[logical], action):
            acc.reopened = True
            started += 1
        taken += 1
    cursor = candidates[taken][1] if taken < len(candidates) else after
    return taken, started, cursor


def _held_back(conn: Connection, limits: AdmissionLimits, b: BackfillInfo, ready: _Ready, acc: _Pass) -> bool:
    """True when one more run of this backfill would exceed an admission limit (counted)."""
    found = find_overload_now(
        conn, limits, dag_id=b.dag_id, adding=queued_roots(ready.version.structure), uncommitted=acc.instances
    )
    if found is None:
        return False
    count_refusal("backfill_drain", found.setting)
    log.info(
        "backfill held back by admission control",
        extra={
            "event": "backfill.held_back",
            "backfill_id": b.id,
            "setting": found.setting,
            "limit_of": found.name,
        },
    )
    return True


def _candidates(
    table: Timetable, b: BackfillInfo, *, now: datetime
) -> tuple[list[Interval], datetime | None]:
    """The next intervals of a backfill from its cursor, and the fire time after them (None: no more)."""
    assert b.cursor is not None
    return next_intervals(table, cursor=b.cursor, remaining=b.total - b.handled, to_date=b.to_date, now=now)


def _ready(
    db: Database, conn: Connection, b: BackfillInfo, dag: DagInfo | None, *, now: datetime
) -> _Ready | None:
    """The DAG's latest version, timetable and default params; pauses the backfill (None) if
    the DAG is gone, has no timed schedule any more, no longer allows backfills, or its params
    have no valid defaults."""
    problem = None
    if dag is None or dag.latest_version_id is None:
        problem = f"DAG {b.dag_id!r} is no longer registered"
    else:
        version = version_of(db, conn, dag.latest_version_id)
        spec = version.structure.schedule
        structure = version.structure
        if spec is None or not spec.is_timed:
            problem = f"DAG {b.dag_id!r} no longer has a cron or interval schedule"
        elif not structure.contract.backfills:
            problem = f"DAG {b.dag_id!r} no longer allows backfills (its contract sets backfills=False)"
        else:
            try:
                params = resolve_params(b.dag_id, structure.params_schema, {}, rules=structure.param_rules)
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
    tt: float | None,
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
        default_task_timeout_s=tt,
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
