"""Datasets: events recorded when producing tasks succeed, and the runs those events trigger.

Recording: a successful (applied) attempt of a task with `outlets` appends one event per outlet
in the transaction of the success itself (`outlet_event_rows` + `record_outlet_events`, called
by engine/execution.py); a run in shadow mode records none. Tasks without outlets pay nothing.

Triggering (`trigger_dataset_runs`, leader only): each dataset-scheduled DAG keeps one mark per
dataset, the newest event id its runs consumed. Once every one of its datasets has an event past
its mark, one run is created that consumes all of them (a burst becomes one run) and every mark
moves to its dataset's newest event, in the same fenced transaction.

A DAG seen for the first time (no marks at all) starts at the datasets' current newest events
without a run: only events recorded after its first trigger pass count. Events recorded between
its registration and that pass (normally under one scheduler tick) are treated as old. A
dataset added to an existing DAG's schedule has no mark yet and counts from 0 (its history).
A paused DAG is not looked at: its marks stay, and the events of the pause are consumed by the
first run after it is unpaused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.admission import NO_LIMITS, AdmissionLimits
from treadle.domain.durations import DEFAULT_TASK_TIMEOUT_S
from treadle.domain.identifiers import is_dataset_name
from treadle.domain.manifest import DatasetConsumption
from treadle.domain.params import resolve_params
from treadle.domain.records import RunInfo
from treadle.domain.states import RunType
from treadle.domain.task_records import ClaimedTask
from treadle.domain.timetable import ScheduleSpec
from treadle.engine import lineage
from treadle.engine.admission import (
    audit_refusal,
    count_refusal,
    find_overload_now,
    is_dataset_refusal_audited,
    overloaded,
)
from treadle.engine.runs import new_run, queued_per_queue
from treadle.engine.scheduling import LEADER_LEASE, SCHEDULER_IDENTITY
from treadle.engine.versions import version_of
from treadle.errors import InvalidRequest, MarksMoved, NotLeader, ParamsInvalid
from treadle.store import datasets as dataset_store
from treadle.store import dialects
from treadle.store import leases as lease_store
from treadle.store import runs as run_store
from treadle.store import schedules as schedule_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now
from treadle.store.datasets import DatasetEventInfo

log = logging.getLogger("treadle.scheduler")

#: Most consumed events a run manifest lists (the newest of each dataset first, then the
#: newest overall); the total and the id range per dataset are always recorded.
MAX_LISTED_EVENTS = 1_000
#: Most runs one trigger pass creates; the rest are created by the next pass.
MAX_RUNS_PER_PASS = 100
#: Most events `treadle datasets events` shows at once.
MAX_EVENTS_LIMIT = 1_000
#: Longest event version (the `dataset_events.version` column; the task context checks it too).
MAX_VERSION_CHARS = 250


# -- recording ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OutletEvent:
    """What a task said about the event it records on one outlet: a version and metadata."""

    version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # Any: user JSON


def parse_outlet_events(data: Any) -> dict[str, OutletEvent]:
    """The outlet annotations of a child's success reply ({dataset: {"version", "metadata"}}).

    Raises ValueError naming the problem when the reply is malformed (the child checks limits).
    """
    if not data:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"outlet_events must be an object, got {type(data).__name__}")
    parsed = {}
    for name, event in data.items():
        if not isinstance(name, str) or not is_dataset_name(name) or not isinstance(event, dict):
            raise ValueError(f"outlet event {name!r:.80}: expected a dataset name and an object")
        version, metadata = event.get("version"), event.get("metadata") or {}
        if version is not None and (not isinstance(version, str) or len(version) > MAX_VERSION_CHARS):
            raise ValueError(
                f"outlet event {name!r}: version must be a string of at most {MAX_VERSION_CHARS} characters"
            )
        if not isinstance(metadata, dict):
            raise ValueError(f"outlet event {name!r}: metadata must be an object")
        parsed[name] = OutletEvent(version=version, extra=metadata)
    return parsed


def outlet_event_rows(
    db: Database,
    conn: Connection,
    task: ClaimedTask,
    outlets: Sequence[str],
    annotations: Mapping[str, OutletEvent],
    *,
    at: datetime,
) -> list[dict[str, Any]]:
    """The dataset_events rows of one applied success: one per outlet, none in a shadow run.

    The run's mode comes from the worker's run cache (filled when the attempt was claimed);
    a miss reads the run once.
    """
    run = db.run_cache.get(task.run_id)
    if run is None:
        run = run_store.get_run(conn, task.run_id)
        if run is None:
            return []
        db.run_cache[task.run_id] = run
    if run.mode == "shadow":
        return []
    rows = []
    for name in outlets:
        given = annotations.get(name) or OutletEvent()
        rows.append(
            {
                "dataset": name,
                "run_id": task.run_id,
                "dag_id": task.dag_id,
                "task_id": task.task_id,
                "version": given.version,
                "extra": given.extra,
                "created_at": at,
            }
        )
    return rows


def record_outlet_events(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Append the events and move their datasets' last event, in the caller's transaction."""
    if rows:
        dataset_store.record_events(conn, rows, at=max(r["created_at"] for r in rows))


# -- triggering -----------------------------------------------------------------------------------


def trigger_dataset_runs(
    db: Database,
    *,
    holder: str,
    epoch: int,
    default_queue_timeout_s: float,
    limit: int = MAX_RUNS_PER_PASS,
    default_task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S,
    admission: AdmissionLimits = NO_LIMITS,
) -> int:
    """Create one run of each unpaused dataset-scheduled DAG whose every dataset has a new event.

    One transaction, fenced by the leader lease at `epoch` (NotLeader if lost): the runs, their
    task instances and the moved marks commit together. A DAG at `max_active_runs` active
    dataset runs waits (its events accumulate for a later run), and so does one whose run would
    exceed an `admission` limit: that refusal is counted each pass and audited (actor
    `scheduler`) at most once a minute per DAG. When nothing changed this costs
    a handful of small queries: the schedules, the marks and the datasets' newest event ids.
    Returns how many runs were created.
    """

    def work(conn: Connection) -> int:
        now = db_now(conn)
        if not lease_store.hold(conn, LEADER_LEASE, holder=holder, epoch=epoch, now=now):
            raise NotLeader(holder=holder, epoch=epoch)
        rows = schedule_store.dataset_schedules(conn)
        if not rows:
            return 0
        specs = {r.dag_id: ScheduleSpec.from_json(r.spec) for r in rows}
        marks = dataset_store.consumer_marks(conn, specs)
        latest = dataset_store.last_event_ids(conn, (n for s in specs.values() for n in s.datasets))
        moves = _first_marks(specs, marks, latest)
        ready = [
            r
            for r in rows
            if r.dag_id in marks
            and r.latest_version_id is not None
            and all(latest.get(n, 0) > marks[r.dag_id].get(n, 0) for n in specs[r.dag_id].datasets)
        ]
        runs: list[RunInfo] = []
        instances: list[dict[str, Any]] = []
        active = schedule_store.active_run_counts(conn, [r.dag_id for r in ready], run_type=RunType.DATASET)
        for row in ready:
            spec, mine = specs[row.dag_id], marks[row.dag_id]
            if len(runs) >= limit or active.get(row.dag_id, 0) >= spec.max_active_runs:
                continue  # waits: its events stay unconsumed
            ranges = {n: (mine.get(n, 0), latest[n]) for n in spec.datasets}
            built = _dataset_run(
                db,
                conn,
                row,
                ranges,
                now=now,
                epoch=epoch,
                timeout_s=default_queue_timeout_s,
                task_timeout_s=default_task_timeout_s,
            )
            if built is not None and not _admitted(conn, admission, row.dag_id, built[1], instances, now=now):
                continue  # waits like a DAG at max_active_runs: its events stay unconsumed
            if built is not None:
                runs.append(built[0])
                instances.extend(built[1])
            moves.extend((row.dag_id, n, mine.get(n), latest[n]) for n in spec.datasets)
        moved = dataset_store.set_marks(conn, moves) if moves else 0
        if moved != len(moves):
            raise MarksMoved(dag_ids=sorted({m[0] for m in moves}), expected=len(moves), moved=moved)
        if runs:
            run_store.insert_runs(conn, runs)
            lineage.runs_started(db, conn, runs)
            ti_store.insert_task_instances(conn, instances)
            dialects.notify_ready(conn)
            log.info(
                "dataset runs created",
                extra={"event": "scheduler.dataset_runs", "runs": [r.run_id for r in runs], "epoch": epoch},
            )
        return len(runs)

    return db.transact(work, retry_conflicts=True)


def _admitted(
    conn: Connection,
    limits: AdmissionLimits,
    dag_id: str,
    rows: list[dict[str, Any]],
    earlier: list[dict[str, Any]],
    *,
    now: datetime,
) -> bool:
    """Whether this dataset run fits the admission limits; a refusal is counted and audited.

    `earlier`: the task instances of the runs this pass created before (inserted at its end).
    """
    found = find_overload_now(conn, limits, dag_id=dag_id, adding=queued_per_queue(rows), uncommitted=earlier)
    if found is None:
        return True
    exc = overloaded(found, what=f"a dataset run of DAG {dag_id!r}")
    count_refusal("dataset_run", exc.setting)
    # Audited and logged once a minute per DAG, not every pass it is held back.
    if not is_dataset_refusal_audited(conn, dag_id, now=now):
        audit_refusal(
            conn, exc, kind="dataset_run", dag_id=dag_id, actor=SCHEDULER_IDENTITY, address=None, at=now
        )
        log.warning(str(exc), extra={"event": "scheduler.dataset_run_refused", "dag_id": dag_id})
    return False


def _first_marks(
    specs: Mapping[str, ScheduleSpec], marks: Mapping[str, Mapping[str, int]], latest: Mapping[str, int]
) -> list[tuple[str, str, int | None, int]]:
    """Marks of DAGs seen for the first time: each dataset's current newest event (no run)."""
    return [
        (dag_id, name, None, latest.get(name, 0))
        for dag_id, spec in specs.items()
        if dag_id not in marks
        for name in spec.datasets
    ]


def _dataset_run(
    db: Database,
    conn: Connection,
    row: schedule_store.ScheduleRow,
    ranges: Mapping[str, tuple[int, int]],
    *,
    now: datetime,
    epoch: int,
    timeout_s: float,
    task_timeout_s: float | None,
) -> tuple[RunInfo, list[dict[str, Any]]] | None:
    """The run (and task instances) consuming the events in `ranges`; None if it cannot run."""
    assert row.latest_version_id is not None
    version = version_of(db, conn, row.latest_version_id)
    try:
        structure = version.structure
        params = resolve_params(row.dag_id, structure.params_schema, {}, rules=structure.param_rules)
    except ParamsInvalid as exc:
        # Consumed without a run, like a cron slot passed over for the same reason.
        log.error(
            "dataset run not created: params have no valid defaults",
            extra={"event": "scheduler.params_invalid", "dag_id": row.dag_id, "error": str(exc)},
        )
        return None
    summaries = dataset_store.range_summaries(conn, ranges)
    listed = _listed_events(conn, ranges)
    firsts = [s.first_at for s in summaries.values()]
    lasts = [s.last_at for s in summaries.values()]
    interval = (min(firsts), max(lasts)) if firsts else (now, now)
    return new_run(
        version,
        run_type=RunType.DATASET,
        logical_date=now,
        data_interval=interval,
        conf={},
        params=params,
        triggered_by=SCHEDULER_IDENTITY,
        now=now,
        default_queue_timeout_s=timeout_s,
        default_task_timeout_s=task_timeout_s,
        leader_epoch=epoch,
        consumed=DatasetConsumption(
            events=[_manifest_entry(e) for e in listed],
            total=sum(s.count for s in summaries.values()),
            ranges={
                name: {
                    "after_id": after,
                    "through_id": through,
                    "count": summaries[name].count if name in summaries else 0,
                }
                for name, (after, through) in ranges.items()
            },
        ),
    )


def _listed_events(conn: Connection, ranges: Mapping[str, tuple[int, int]]) -> list[DatasetEventInfo]:
    """The consumed events a manifest lists, oldest first: at most MAX_LISTED_EVENTS, always
    including each dataset's newest, then the newest overall."""
    per_dataset = [
        dataset_store.newest_in_range(conn, name, after_id=after, through_id=through, limit=MAX_LISTED_EVENTS)
        for name, (after, through) in sorted(ranges.items())
    ]
    chosen = {found[0].id: found[0] for found in per_dataset[:MAX_LISTED_EVENTS] if found}
    rest = sorted((e for found in per_dataset for e in found), key=lambda e: e.id, reverse=True)
    for event in rest:
        if len(chosen) >= MAX_LISTED_EVENTS:
            break
        chosen.setdefault(event.id, event)
    return sorted(chosen.values(), key=lambda e: e.id)


def _manifest_entry(event: DatasetEventInfo) -> dict[str, Any]:
    """How a consumed event appears in a run manifest (no metadata: it can be large)."""
    return {
        "id": event.id,
        "dataset": event.dataset,
        "run_id": event.run_id,
        "dag_id": event.dag_id,
        "task_id": event.task_id,
        "version": event.version,
        "created_at": event.created_at.isoformat(),
    }


# -- reading --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetView:
    """A dataset: its events so far, which tasks produce it and which DAGs it schedules."""

    name: str
    #: When its first event was recorded; None if it never had one.
    created_at: datetime | None
    events: int
    last_event_id: int | None
    last_event_at: datetime | None
    #: `dag_id.task_id` of the tasks whose latest registered version names it as an outlet.
    producers: tuple[str, ...]
    #: DAGs scheduled on it (paused ones included).
    consumers: tuple[str, ...]
    #: Consumers that are paused.
    paused_consumers: tuple[str, ...] = ()


def list_datasets(db: Database) -> list[DatasetView]:
    """Every dataset that has events or that a registered DAG produces or waits for, by name."""

    def work(conn: Connection) -> list[DatasetView]:
        rows = {r.name: r for r in dataset_store.list_datasets(conn)}
        producers: dict[str, list[str]] = {}
        for structure in dataset_store.latest_structures(conn):
            for task_id, t in sorted(structure.tasks.items()):
                for name in t.outlets:
                    producers.setdefault(name, []).append(f"{structure.dag_id}.{task_id}")
        consumers: dict[str, list[str]] = {}
        paused: dict[str, list[str]] = {}
        for c in dataset_store.consumer_schedules(conn):
            for name in c.spec.get("datasets") or ():
                consumers.setdefault(name, []).append(c.dag_id)
                if c.is_paused:
                    paused.setdefault(name, []).append(c.dag_id)
        views = []
        for name in sorted(set(rows) | set(producers) | set(consumers)):
            row = rows.get(name)
            views.append(
                DatasetView(
                    name=name,
                    created_at=row.created_at if row else None,
                    events=row.events if row else 0,
                    last_event_id=row.last_event_id if row else None,
                    last_event_at=row.last_event_at if row else None,
                    producers=tuple(producers.get(name, ())),
                    consumers=tuple(consumers.get(name, ())),
                    paused_consumers=tuple(paused.get(name, ())),
                )
            )
        return views

    return db.query(work)


def dataset_events(db: Database, name: str, *, limit: int = 50) -> list[DatasetEventInfo]:
    """The newest `limit` events of dataset `name`, newest first.

    Raises InvalidRequest for a malformed name, a limit outside 1..MAX_EVENTS_LIMIT, or a
    dataset that no event and no registered DAG names.
    """
    if not is_dataset_name(name):
        raise InvalidRequest(f"dataset name {name!r:.80} must be 1-500 URI characters without spaces")
    if not 1 <= limit <= MAX_EVENTS_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_EVENTS_LIMIT}, got {limit}")

    def work(conn: Connection) -> list[DatasetEventInfo]:
        found = dataset_store.events(conn, name, limit=limit)
        if not found and not dataset_store.exists(conn, name) and not _declared(conn, name):
            raise InvalidRequest(
                f"no dataset {name!r}: no event recorded and no registered DAG produces or waits for it"
            )
        return found

    return db.query(work)


def run_dataset_events(db: Database, run_id: str) -> list[DatasetEventInfo]:
    """Events the tasks of run `run_id` recorded, oldest first."""
    return db.query(lambda conn: dataset_store.events_of_run(conn, run_id))


def _declared(conn: Connection, name: str) -> bool:
    """True if a registered DAG's latest version produces `name` or a DAG is scheduled on it."""
    if any(name in (c.spec.get("datasets") or ()) for c in dataset_store.consumer_schedules(conn)):
        return True
    return any(name in t.outlets for s in dataset_store.latest_structures(conn) for t in s.tasks.values())
