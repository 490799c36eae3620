"""Backfill planning: which intervals of a schedule a backfill covers and what happens to each.

Pure: takes a schedule, a request and `now`, returns a decision (or InvalidRequest naming the
problem). The engine reads the database around it (engine/backfill_actions.py validates and
records requests, engine/backfill_drain.py applies the decisions).

An interval is one schedule slot: its logical date is the data interval start; the range
[from, to] (inclusive) selects slots by logical date. Only intervals that have ended are
included (the scheduler runs the others), and only within the DAG's start/end dates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from treadle.domain.records import RunInfo
from treadle.domain.states import TERMINAL_RUN_STATES, RunState
from treadle.domain.timetable import ScheduleSpec, Timetable
from treadle.errors import InvalidRequest

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
#: Actions that start a run (a new one or a cleared one) and so use the backfill's budget.
STARTS_RUN = (CREATE, RERUN_FAILED, RERUN_ALL)
_US = timedelta(microseconds=1)

#: (logical date, fire time) of one interval.
Interval = tuple[datetime, datetime]


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
class BackfillRange:
    """A validated backfill range: its bounds in UTC, its run budget and its ended intervals."""

    from_date: datetime
    to_date: datetime
    max_active: int
    #: Every interval, oldest first.
    intervals: list[Interval]
    #: True when intervals in the range were left out because they have not ended.
    open_left_out: bool


def read_date(value: str | datetime, zone: ZoneInfo, what: str, *, whole_day: bool = False) -> datetime:
    """An ISO date or date-time as UTC; a date or a time without offset is read in `zone`.

    A date alone (`2026-05-01`) is the start of that day in `zone`, or with `whole_day` (an
    inclusive upper bound) its last microsecond, so that every logical date on that day is in.
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidRequest(f"{what} {value!r} is not an ISO-8601 date or date-time") from None
        if whole_day and _is_date_alone(text):
            next_day = datetime.combine(parsed.date() + timedelta(days=1), time(), tzinfo=zone)
            return next_day.astimezone(UTC) - _US
    else:
        parsed = value
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        parsed = parsed.replace(tzinfo=zone)
    return parsed.astimezone(UTC)


def _is_date_alone(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def check_options(*, reason: str, mode: str, rerun: str) -> str:
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


def check_range(
    dag_id: str,
    spec: ScheduleSpec,
    *,
    from_date: str | datetime,
    to_date: str | datetime,
    max_active: int | None,
    max_span_days: float,
    now: datetime,
) -> BackfillRange:
    """Validate a backfill range of a timed schedule; InvalidRequest naming the problem.

    Naive dates are read in the schedule's time zone, and a `to_date` that is a date alone means
    the whole of that day there (read_date); `max_active` defaults to the DAG's
    `max_active_runs`, its upper bound.
    """
    zone = ZoneInfo(spec.timezone)
    start = read_date(from_date, zone, "--from")
    end = read_date(to_date, zone, "--to", whole_day=True)
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
    intervals, open_left_out = ended_intervals(Timetable(spec), start=start, end=end, now=now)
    if not intervals:
        raise InvalidRequest(_empty_message(dag_id, spec, start=start, end=end, open_left=open_left_out))
    if len(intervals) > MAX_INTERVALS:
        raise InvalidRequest(
            f"the range holds more than {MAX_INTERVALS} intervals, the most one backfill may cover; "
            "split it into smaller backfills"
        )
    return BackfillRange(
        from_date=start, to_date=end, max_active=active, intervals=intervals, open_left_out=open_left_out
    )


def ended_intervals(
    table: Timetable, *, start: datetime, end: datetime, now: datetime
) -> tuple[list[Interval], bool]:
    """The ended intervals whose logical date is in [start, end], within the DAG's start/end
    dates, at most MAX_INTERVALS + 1; and whether ones were left out because they are open."""
    spec = table.spec
    if spec.start_date is not None:
        start = max(start, spec.start_date)
    if spec.end_date is not None:
        end = min(end, spec.end_date)
    found: list[Interval] = []
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


def _empty_message(
    dag_id: str, spec: ScheduleSpec, *, start: datetime, end: datetime, open_left: bool
) -> str:
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


def interval_action(rerun: str, existing: RunInfo | None) -> str:
    """What a backfill does with an interval whose newest run is `existing`."""
    if existing is None:
        return CREATE
    if rerun == "failed" and existing.state == RunState.FAILED.value:
        return RERUN_FAILED
    if rerun == "all":
        return RERUN_ALL if existing.state in TERMINAL_RUN_STATES else SKIP_ACTIVE
    return SKIP_EXISTING


def dry_run(
    dag_id: str,
    spec: ScheduleSpec,
    *,
    checked: BackfillRange,
    existing: Mapping[datetime, RunInfo],
    reason: str,
    mode: str,
    rerun: str,
    dag_paused: bool,
) -> BackfillPlan:
    """The plan of a validated request: each interval with its action, given the newest run of
    each interval that has one (`existing`, by logical date)."""
    planned = [_planned(logical, fire, rerun, existing.get(logical)) for logical, fire in checked.intervals]
    actions: dict[str, int] = {}
    for interval in planned:
        actions[interval.action] = actions.get(interval.action, 0) + 1
    return BackfillPlan(
        dag_id=dag_id,
        timezone=spec.timezone,
        from_date=checked.from_date,
        to_date=checked.to_date,
        reason=reason,
        mode=mode,
        rerun=rerun,
        max_active=checked.max_active,
        dag_paused=dag_paused,
        open_intervals_left_out=checked.open_left_out,
        intervals=planned,
        actions=actions,
    )


def _planned(logical: datetime, fire: datetime, rerun: str, run: RunInfo | None) -> PlannedInterval:
    return PlannedInterval(
        logical_date=logical,
        data_interval_start=logical,
        data_interval_end=fire,
        fire_at=fire,
        action=interval_action(rerun, run),
        existing_run_id=run.run_id if run else None,
        existing_run_type=run.run_type if run else None,
        existing_state=run.state if run else None,
    )


def next_intervals(
    table: Timetable, *, cursor: datetime, remaining: int, to_date: datetime, now: datetime
) -> tuple[list[Interval], datetime | None]:
    """The next intervals of a backfill from its cursor (a fire time), looking at most
    MAX_SCAN_PER_PASS ahead and at most `remaining` taken; and the fire time after the last one
    looked at (None: no more)."""
    out: list[Interval] = []
    fire = table.next_fire_after(cursor - _US)  # the cursor itself when it is a fire time
    logical = table.prev_fire_before(fire)
    for _ in range(MAX_SCAN_PER_PASS):
        if len(out) >= remaining or (logical is not None and logical > to_date):
            return out, None
        if fire > now:
            return out, fire  # not ended yet (the schedule changed since): wait for it
        if logical is not None and _is_within(table.spec, logical):
            out.append((logical, fire))
        logical, fire = fire, table.next_fire_after(fire)
    return out, fire


def _is_within(spec: ScheduleSpec, logical: datetime) -> bool:
    """True if a logical date is within the DAG's start and end dates."""
    return (spec.start_date is None or logical >= spec.start_date) and (
        spec.end_date is None or logical <= spec.end_date
    )
