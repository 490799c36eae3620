"""Keeping each DAG's schedule row (spec and watermark) in step with its registered structure."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cronsim import CronSim, CronSimError
from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagStructure
from treadle.domain.timetable import ScheduleSpec, Timetable
from treadle.errors import DagNotFound
from treadle.store import dags as dag_store
from treadle.store import schedules as schedule_store
from treadle.store.database import Database, db_now


@functools.lru_cache(maxsize=4096)
def _timetable(spec_json: str) -> Timetable:
    return Timetable(ScheduleSpec.from_json(json.loads(spec_json)))


def initial_next_fire(spec: ScheduleSpec, *, last_fire_at: datetime | None, now: datetime) -> datetime | None:
    """Where a schedule's next fire time stands when its spec is (re)registered.

    After the watermark when there is one; else the first interval from `start_date` (catch-up
    policy applies when it falls due); else the first fire after `now`. None: nothing more to
    fire (end_date passed) or not a timed schedule.
    """
    if not spec.is_timed:
        return None
    table = Timetable(spec)
    if last_fire_at is not None:
        nxt: datetime | None = table.next_fire_after(last_fire_at)
    elif spec.start_date is not None:
        nxt = table.first_fire(spec.start_date)
    else:
        nxt = table.next_fire_after(now)
    return nxt if nxt is not None and table.allowed(nxt) else None


def register_schedules(conn: Connection, structures: Sequence[DagStructure], *, now: datetime) -> None:
    """Keep each DAG's schedule row in step with its latest registered structure.

    An unchanged spec keeps its watermark untouched (and its row unwritten). A changed spec
    keeps `last_fire_at` and recomputes the next fire time from it. A DAG that no longer has a
    schedule keeps its row (and watermark) with no next fire time. Reads and writes are batched.
    """
    current = schedule_store.get_many(conn, [s.dag_id for s in structures])
    rows: list[dict[str, Any]] = []
    for structure in structures:
        found = current.get(structure.dag_id)
        spec = structure.schedule
        spec_json = spec.to_json() if spec else {}
        kind = spec.kind if spec else "none"
        if found is not None and found.spec == spec_json and found.kind == kind:
            continue
        if found is None and spec is None:
            continue
        last = found.last_fire_at if found else None
        nxt = initial_next_fire(spec, last_fire_at=last, now=now) if spec else None
        rows.append(
            {
                "dag_id": structure.dag_id,
                "kind": kind,
                "spec": spec_json,
                "last_fire_at": last,
                "next_fire_at": nxt,
            }
        )
    schedule_store.put_many(conn, rows, existing=set(current), now=now)


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """One future fire time of a schedule and the data interval its run covers."""

    fire_at: datetime
    logical_date: datetime
    data_interval_start: datetime
    data_interval_end: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleView:
    """A DAG's schedule as registered, with its watermark and the database's now."""

    dag_id: str
    spec: ScheduleSpec | None
    last_fire_at: datetime | None
    next_fire_at: datetime | None
    is_paused: bool
    #: False while the DAG is inactive (its file gone or no longer defining it): nothing fires.
    is_active: bool = True
    now: datetime


def schedule_view(db: Database, dag_id: str) -> ScheduleView:
    """The registered schedule of a DAG (spec from its latest version). Raises DagNotFound."""

    def work(conn: Connection) -> ScheduleView:
        dag = dag_store.get_dag(conn, dag_id)
        if dag is None or dag.latest_version_id is None:
            raise DagNotFound(f"no DAG {dag_id!r} is registered (run `treadle dags sync`?)")
        structure = dag_store.get_structure(conn, dag.latest_version_id)
        row = schedule_store.get(conn, dag_id)
        return ScheduleView(
            dag_id=dag_id,
            spec=structure.schedule,
            last_fire_at=row.last_fire_at if row else None,
            next_fire_at=row.next_fire_at if row else None,
            is_paused=dag.is_paused,
            is_active=dag.is_active,
            now=db_now(conn),
        )

    return db.query(work)


def upcoming(spec: ScheduleSpec, *, after: datetime, count: int) -> list[Slot]:
    """The next `count` fire times strictly after `after` that get runs (within start/end dates)."""
    table = Timetable(spec)
    fire: datetime | None = table.next_fire_after(after)
    if spec.start_date is not None:
        first = table.first_fire(spec.start_date)
        if first is None:
            return []
        if fire is None or fire < first:
            fire = first
    slots: list[Slot] = []
    while fire is not None and len(slots) < count and table.allowed(fire):
        start, end = table.data_interval(fire)
        slots.append(Slot(fire_at=fire, logical_date=start, data_interval_start=start, data_interval_end=end))
        fire = table.next_fire_after(fire)
    return slots


def list_schedules(db: Database) -> dict[str, schedule_store.ScheduleRow]:
    """Every DAG's schedule row (spec, watermark), by DAG id."""
    return db.query(schedule_store.all_rows)


def describe(spec: dict[str, Any]) -> str:
    """A short human description of a stored spec ("cron 0 2 * * * Asia/Singapore", ...)."""
    if not spec:
        return "manual"
    parsed = ScheduleSpec.from_json(spec)
    if parsed.kind == "cron":
        text = f"cron {parsed.cron} {parsed.timezone}"
    elif parsed.kind == "interval":
        text = f"every {parsed.interval_s:g}s"
    else:
        text = "datasets " + ", ".join(parsed.datasets)
    return text + (" (catchup)" if parsed.catchup else "")


def in_words(spec: ScheduleSpec | None) -> str:
    """A schedule as a sentence: "At 02:00 every day, Asia/Singapore time; catch-up on"."""
    if spec is None:
        return "no schedule: runs only when triggered"
    if spec.kind == "dataset":
        return "when each of its datasets has a new event: " + ", ".join(spec.datasets)
    if spec.kind == "cron":
        assert spec.cron is not None
        try:
            text = f"{CronSim(spec.cron, datetime(2000, 1, 1)).explain()}, {spec.timezone} time"
        except (CronSimError, ValueError):
            text = f"cron {spec.cron!r}, {spec.timezone} time"
    else:
        assert spec.interval_s is not None
        text = f"every {seconds_in_words(spec.interval_s)}"
    text += f"; catch-up {'on' if spec.catchup else 'off'}; at most {spec.max_active_runs} active runs"
    if spec.start_date is not None:
        text += f"; from {spec.start_date:%Y-%m-%d %H:%M} UTC"
    if spec.end_date is not None:
        text += f"; until {spec.end_date:%Y-%m-%d %H:%M} UTC"
    return text


def seconds_in_words(seconds: float) -> str:
    """A duration in its largest whole unit: 3600 -> "1 h", 5400 -> "90 min", 90 -> "90 s"."""
    units = (("d", 86_400), ("h", 3_600), ("min", 60))
    for unit, size in units:
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    for unit, size in units:
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:g} s"


class Fires:
    """A stored spec's timetable with memoised next/previous fire lookups.

    Many schedules share a spec (`@hourly`, `0 2 * * *`), and every one of them due at the same
    instant asks the same questions; a burst of thousands costs a few cron evaluations, not
    thousands. Fire times are pure functions of (spec, instant), so the cache never goes stale.
    """

    __slots__ = ("key", "spec", "table")

    def __init__(self, spec: ScheduleSpec) -> None:
        self.key = json.dumps(spec.to_json(), sort_keys=True)
        self.table = _timetable(self.key)
        self.spec = spec

    def next_after(self, after: datetime) -> datetime:
        """First fire strictly after `after`."""
        return _next_after(self.key, after)

    def prev_before(self, at: datetime) -> datetime | None:
        """Last fire strictly before `at` (the data interval start of a fire at `at`)."""
        return _prev_before(self.key, at)

    def logical_ok(self, start: datetime | None) -> bool:
        """True if a run whose data interval starts at `start` is within start/end dates."""
        spec = self.spec
        return (
            start is not None
            and (spec.start_date is None or start >= spec.start_date)
            and (spec.end_date is None or start <= spec.end_date)
        )


@functools.lru_cache(maxsize=65536)
def _next_after(key: str, after: datetime) -> datetime:
    return _timetable(key).next_fire_after(after)


@functools.lru_cache(maxsize=65536)
def _prev_before(key: str, at: datetime) -> datetime | None:
    return _timetable(key).prev_fire_before(at)


@functools.lru_cache(maxsize=4096)
def fires_of(spec: ScheduleSpec) -> Fires:
    """The memoised timetable view of a spec (specs are frozen, so equal specs share one)."""
    return Fires(spec)
