"""Schedules of DAGs and their fire times (pure: no I/O, no clock).

A DAG is scheduled by a cron expression (evaluated in an IANA time zone), by a fixed interval, by
datasets (a run when upstream datasets change), or not at all (manual runs only).

Run semantics
-------------
Each fire time ``f`` closes a *data interval* ``[previous fire, f)``. The run created at ``f`` has
``logical_date = data_interval_start = previous fire``: a run is named after the period it covers and
starts once that period is over. With ``schedule="0 2 * * *"`` the "2026-07-04 run" covers
2026-07-04 02:00 to 2026-07-05 02:00 local time and fires at 2026-07-05 02:00.

``start_date`` S: the first data interval starts at the first fire time at or after S, so the first run
fires at the second fire time at or after S. ``end_date`` E: no run whose logical date is after E.
A fire ``f`` is *allowed* when its data interval start lies in ``[S, E]``.

Intervals fire at ``anchor + k * interval`` (k = 0, 1, 2, ...), where the anchor is ``start_date``, or
1970-01-01T00:00Z when there is none: a 1-second interval fires on whole seconds, 1 hour on whole UTC
hours. Intervals are plain UTC arithmetic; daylight saving time does not affect them.

Daylight saving time (cron schedules)
-------------------------------------
Cron fields are matched against the local wall time of the schedule's time zone, like Debian cron.
An entry is *fixed-time* when neither its minute nor its hour field starts with ``*``
(``30 2 * * *``, ``0 9-17 * * 1-5``); other entries (``*/30 * * * *``, ``15 * * * *``, ``0 */2 * * *``)
are *wildcard* entries.

* Wildcard entries fire at every real instant whose local wall time matches: wall times skipped by a
  spring-forward transition do not fire; wall times repeated by a fall-back transition fire twice.
* Fixed-time entries whose wall time falls in a spring-forward gap fire once at the first instant after
  the gap (``dst_gap="shift"``, the default: ``30 2 * * *`` in New York fires at 03:00 EDT on the
  spring-forward day), or not at all that day (``dst_gap="skip"``).
* Fixed-time entries whose wall time is repeated by a fall-back transition fire once, at the first
  occurrence (``dst_overlap="first"``, the default), or at both occurrences (``dst_overlap="both"``).

Several entries that shift to the same instant fire once. All datetimes given to and returned by this
module are timezone-aware UTC; a naive datetime is an error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

DstGap = Literal["shift", "skip"]
DstOverlap = Literal["first", "both"]
ScheduleKind = Literal["cron", "interval", "dataset"]

#: Cron presets and the 5-field expressions they stand for.
PRESETS: dict[str, str] = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}

_DST_GAPS: tuple[str, ...] = get_args(DstGap)
_DST_OVERLAPS: tuple[str, ...] = get_args(DstOverlap)
_KINDS: tuple[str, ...] = get_args(ScheduleKind)
_CRON_FIELDS = "minute hour day-of-month month day-of-week"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_SECOND = timedelta(seconds=1)


# ---------------------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------------------


def _zone(name: object, field: str = "timezone") -> ZoneInfo:
    """Return the ZoneInfo named `name`, or raise ValueError naming the field."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{field}: unknown time zone {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"{field}: unknown time zone {name!r}") from None


def _aware_utc(value: datetime, field: str) -> datetime:
    """Return `value` converted to UTC; ValueError if it is naive."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{field} must be timezone-aware (UTC), got naive {value.isoformat()!r}")
    return value.astimezone(UTC)


def _normalize_cron(text: str) -> str:
    """Expand a preset or validate a 5-field cron expression; return the normalized expression."""
    stripped = text.strip()
    if stripped.startswith("@"):
        preset = PRESETS.get(stripped.lower())
        if preset is None:
            known = ", ".join(sorted(PRESETS))
            raise ValueError(f"schedule: unknown preset {text!r}; known presets: {known}")
        return preset
    fields = stripped.upper().split()
    if len(fields) != 5:
        raise ValueError(
            f"schedule: invalid cron expression {text!r}: expected 5 fields ({_CRON_FIELDS}), "
            f"got {len(fields)}"
        )
    expr = " ".join(fields)
    try:
        next(CronSim(expr, datetime(2000, 1, 1)))
    except CronSimError as exc:
        raise ValueError(f"schedule: invalid cron expression {text!r}: {exc}") from None
    except StopIteration:
        raise ValueError(f"schedule: invalid cron expression {text!r}: it never fires") from None
    return expr


def _read_datetime(value: datetime | str | None, field: str, zone: ZoneInfo) -> datetime | None:
    """Read an aware datetime, a naive one (wall time in `zone`) or an ISO-8601 string as UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{field}: invalid ISO-8601 date-time {value!r}") from None
    elif isinstance(value, datetime):
        parsed = value
    else:
        raise ValueError(f"{field}: expected a datetime or an ISO-8601 string, got {value!r}")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        parsed = parsed.replace(tzinfo=zone, fold=0)
    return parsed.astimezone(UTC)


def _interval_seconds(value: float, field: str = "schedule") -> float:
    """Return `value` as a positive, finite number of seconds (at least one microsecond)."""
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 1e-6:
        raise ValueError(f"{field}: an interval must be greater than zero, got {value!r}")
    return seconds


# ---------------------------------------------------------------------------------------------------------
# ScheduleSpec and parse_schedule
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """How a DAG is scheduled (JSON-serializable; stored with each DAG version)."""

    kind: ScheduleKind
    cron: str | None = None
    interval_s: float | None = None
    timezone: str = "UTC"
    dst_gap: DstGap = "shift"
    dst_overlap: DstOverlap = "first"
    start_date: datetime | None = None
    end_date: datetime | None = None
    catchup: bool = False
    max_active_runs: int = 16
    datasets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Validate the fields; normalize the cron expression, datetimes (UTC) and dataset names."""
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        self._check_kind_fields()
        _zone(self.timezone)
        if self.dst_gap not in _DST_GAPS:
            raise ValueError(f"dst_gap must be one of {', '.join(_DST_GAPS)}, got {self.dst_gap!r}")
        if self.dst_overlap not in _DST_OVERLAPS:
            raise ValueError(
                f"dst_overlap must be one of {', '.join(_DST_OVERLAPS)}, got {self.dst_overlap!r}"
            )
        if not isinstance(self.catchup, bool):
            raise ValueError(f"catchup must be a bool, got {self.catchup!r}")
        if (
            not isinstance(self.max_active_runs, int)
            or isinstance(self.max_active_runs, bool)
            or self.max_active_runs < 1
        ):
            raise ValueError(f"max_active_runs must be an integer >= 1, got {self.max_active_runs!r}")
        start = None if self.start_date is None else _aware_utc(self.start_date, "start_date")
        end = None if self.end_date is None else _aware_utc(self.end_date, "end_date")
        if start is not None and end is not None and end < start:
            raise ValueError(f"end_date {end.isoformat()} is before start_date {start.isoformat()}")
        object.__setattr__(self, "start_date", start)
        object.__setattr__(self, "end_date", end)

    def _check_kind_fields(self) -> None:
        """Check that exactly the fields of this kind are set."""
        if self.kind == "cron":
            if not isinstance(self.cron, str):
                raise ValueError(f"cron: a cron schedule needs an expression, got {self.cron!r}")
            object.__setattr__(self, "cron", _normalize_cron(self.cron))
        elif self.cron is not None:
            raise ValueError(f"cron is only for kind 'cron', got {self.cron!r} with kind {self.kind!r}")
        if self.kind == "interval":
            if self.interval_s is None or isinstance(self.interval_s, bool):
                raise ValueError(f"interval_s: an interval schedule needs seconds, got {self.interval_s!r}")
            object.__setattr__(self, "interval_s", _interval_seconds(self.interval_s, "interval_s"))
        elif self.interval_s is not None:
            raise ValueError(f"interval_s is only for kind 'interval', got {self.interval_s!r}")
        if self.kind == "dataset":
            names = tuple(sorted(set(self.datasets)))
            if not names or not all(isinstance(n, str) and n.strip() for n in names):
                raise ValueError(
                    f"datasets: a dataset schedule needs non-empty dataset names, got {list(self.datasets)!r}"
                )
            object.__setattr__(self, "datasets", names)
        elif self.datasets:
            raise ValueError(f"datasets are only for kind 'dataset', got {list(self.datasets)!r}")

    @property
    def is_timed(self) -> bool:
        """True for cron and interval schedules (fire times come from a Timetable)."""
        return self.kind in ("cron", "interval")

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form (datetimes as ISO-8601 strings; always the same keys)."""
        return {
            "kind": self.kind,
            "cron": self.cron,
            "interval_s": self.interval_s,
            "timezone": self.timezone,
            "dst_gap": self.dst_gap,
            "dst_overlap": self.dst_overlap,
            "start_date": None if self.start_date is None else self.start_date.isoformat(),
            "end_date": None if self.end_date is None else self.end_date.isoformat(),
            "catchup": self.catchup,
            "max_active_runs": self.max_active_runs,
            "datasets": list(self.datasets),
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> ScheduleSpec:
        """Build from the JSON form written by `to_json` (missing keys take their defaults)."""

        def when(key: str) -> datetime | None:
            raw = data.get(key)
            if raw is None:
                return None
            try:
                return datetime.fromisoformat(str(raw))
            except ValueError:
                raise ValueError(f"{key}: invalid ISO-8601 date-time {raw!r}") from None

        interval = data.get("interval_s")
        return ScheduleSpec(
            kind=data["kind"],
            cron=data.get("cron"),
            interval_s=None if interval is None else float(interval),
            timezone=data.get("timezone", "UTC"),
            dst_gap=data.get("dst_gap", "shift"),
            dst_overlap=data.get("dst_overlap", "first"),
            start_date=when("start_date"),
            end_date=when("end_date"),
            catchup=data.get("catchup", False),
            max_active_runs=data.get("max_active_runs", 16),
            datasets=tuple(data.get("datasets") or ()),
        )


def _schedule_fields(schedule: str | timedelta | float | int | Sequence[str]) -> dict[str, Any]:
    """Return the kind-specific ScheduleSpec fields for a `schedule` argument."""
    if isinstance(schedule, str):
        return {"kind": "cron", "cron": _normalize_cron(schedule)}
    if isinstance(schedule, timedelta):
        return {"kind": "interval", "interval_s": _interval_seconds(schedule.total_seconds())}
    if isinstance(schedule, bool):
        raise ValueError(f"schedule: expected a cron expression, interval or dataset names, got {schedule!r}")
    if isinstance(schedule, int | float):
        return {"kind": "interval", "interval_s": _interval_seconds(schedule)}
    if isinstance(schedule, Sequence):
        names = list(schedule)
        if not names:
            raise ValueError("schedule: a dataset schedule needs at least one dataset name, got []")
        if not all(isinstance(n, str) and n.strip() for n in names):
            raise ValueError(f"schedule: dataset names must be non-empty strings, got {names!r}")
        return {"kind": "dataset", "datasets": tuple(sorted(set(names)))}
    raise ValueError(f"schedule: expected a cron expression, interval or dataset names, got {schedule!r}")


def parse_schedule(
    schedule: str | timedelta | float | int | Sequence[str] | None,
    *,
    timezone: str = "UTC",
    start_date: datetime | str | None = None,
    end_date: datetime | str | None = None,
    catchup: bool = False,
    max_active_runs: int = 16,
    dst_gap: str = "shift",
    dst_overlap: str = "first",
) -> ScheduleSpec | None:
    """Turn the `schedule=` argument of a DAG and its options into a validated ScheduleSpec.

    None means manual runs only (returns None). A str starting with '@' is a preset (see PRESETS);
    another str is a 5-field cron expression; a timedelta or a positive number of seconds is an interval;
    a non-empty sequence of str is a dataset schedule. start_date/end_date are aware datetimes or
    ISO-8601 strings; naive values (and date-only strings) are wall times in `timezone`.

    Raises:
        ValueError: Any invalid value; the message names the field and the value.
    """
    if schedule is None:
        return None
    zone = _zone(timezone)
    return ScheduleSpec(
        **_schedule_fields(schedule),
        timezone=timezone,
        dst_gap=cast(DstGap, dst_gap),  # validated by ScheduleSpec
        dst_overlap=cast(DstOverlap, dst_overlap),
        start_date=_read_datetime(start_date, "start_date", zone),
        end_date=_read_datetime(end_date, "end_date", zone),
        catchup=catchup,
        max_active_runs=max_active_runs,
    )


# ---------------------------------------------------------------------------------------------------------
# Fire-time engines
# ---------------------------------------------------------------------------------------------------------


class _Fires:
    """Raw fire times of one schedule, without start/end bounds."""

    def next_after(self, after: datetime) -> datetime | None:
        """The first fire strictly after `after`, or None."""
        raise NotImplementedError

    def prev_before(self, at: datetime) -> datetime | None:
        """The last fire strictly before `at`, or None."""
        raise NotImplementedError


class _IntervalFires(_Fires):
    """anchor + k * step for k >= 0 (integer microseconds: exact)."""

    def __init__(self, anchor: datetime, seconds: float) -> None:
        self._anchor = anchor
        self._step_us = max(round(seconds * 1_000_000), 1)

    def next_after(self, after: datetime) -> datetime | None:
        if after < self._anchor:
            return self._anchor
        k = (after - self._anchor) // _US // self._step_us + 1
        return self._anchor + timedelta(microseconds=k * self._step_us)

    def prev_before(self, at: datetime) -> datetime | None:
        if at <= self._anchor:
            return None
        k = ((at - self._anchor) // _US - 1) // self._step_us
        return self._anchor + timedelta(microseconds=k * self._step_us)


class _CronFires(_Fires):
    """Cron instants in a time zone, with the DST policy applied.

    Cron matches are enumerated as naive local wall times ("labels") with cronsim, which on naive
    datetimes is plain calendar arithmetic in both directions. Each label becomes zero, one or two
    instants: its first occurrence (fold=0), the transition instant (a fixed-time label in a gap under
    "shift"), and its second occurrence (an ambiguous label, for wildcard entries or "both").
    First occurrences increase with the label; a second occurrence can only interleave with them inside
    the fall-back window around its own transition, which is where the searches look for it.
    """

    def __init__(self, expr: str, zone: ZoneInfo, gap: DstGap, overlap: DstOverlap) -> None:
        minute, hour = expr.split()[:2]
        fixed = not minute.startswith("*") and not hour.startswith("*")
        self._expr = expr
        self._zone = zone
        self._shift_gap = fixed and gap == "shift"
        self._second_occurrence = not fixed or overlap == "both"

    # -- wall-time helpers ------------------------------------------------------------------------------

    def _labels(self, start: datetime, *, reverse: bool) -> Iterator[datetime]:
        """Naive wall times matching the expression, strictly after (before) naive `start`."""
        try:
            yield from CronSim(self._expr, start, reverse=reverse)
        except OverflowError:  # ran off the representable calendar: no more matches
            return

    def _wall(self, instant: datetime) -> tuple[datetime, int]:
        """Return (naive local wall time, fold) of a UTC instant."""
        local = instant.astimezone(self._zone)
        return local.replace(tzinfo=None, fold=0), local.fold

    def _offsets(self, label: datetime) -> tuple[timedelta, timedelta]:
        """UTC offsets of a wall time read with fold=0 and fold=1 (differ in a gap or an overlap)."""
        first = label.replace(tzinfo=self._zone, fold=0).utcoffset()
        second = label.replace(tzinfo=self._zone, fold=1).utcoffset()
        assert first is not None and second is not None
        return first, second

    def _offset_at(self, epoch_s: int) -> timedelta:
        offset = (_EPOCH + timedelta(seconds=epoch_s)).astimezone(self._zone).utcoffset()
        assert offset is not None
        return offset

    def _gap_end(self, label: datetime, before: timedelta, after: timedelta) -> datetime:
        """The first instant after the spring-forward gap that contains the wall time `label`."""
        # Instants in (label - after, label - before] straddle the transition; transitions are on
        # whole seconds, so bisect on seconds for the first one with the new offset.
        lo = int((label - after - datetime(1970, 1, 1)).total_seconds())
        hi = int((label - before - datetime(1970, 1, 1)).total_seconds())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset_at(mid) == before:
                lo = mid
            else:
                hi = mid
        return _EPOCH + timedelta(seconds=hi)

    def _first_instant(self, label: datetime) -> datetime | None:
        """The fold=0 fire of a label (or the shifted fire of a gap label), if it fires."""
        o0, o1 = self._offsets(label)
        if o0 < o1:  # spring-forward gap: the wall time does not exist
            return self._gap_end(label, o0, o1) if self._shift_gap else None
        return (label - o0).replace(tzinfo=UTC)

    def _second_instant(self, label: datetime) -> datetime | None:
        """The fold=1 fire of an ambiguous label, if the policy fires it."""
        o0, o1 = self._offsets(label)
        if o0 > o1 and self._second_occurrence:
            return (label - o1).replace(tzinfo=UTC)
        return None

    # -- searches ---------------------------------------------------------------------------------------

    def next_after(self, after: datetime) -> datetime | None:
        wall, fold = self._wall(after)
        best: datetime | None = None
        for label in self._labels(wall, reverse=False):
            instant = self._first_instant(label)
            if instant is not None and instant > after:
                best = instant
                break
        o0, o1 = self._offsets(wall)
        if self._second_occurrence and o0 > o1:
            # `after` lies in a fall-back window: a repeated wall time whose first occurrence is at or
            # before `after` may fire a second time after it. Those labels are within one overlap width.
            width = o0 - o1
            for label in self._labels(wall - width if fold == 0 else wall, reverse=False):
                if label >= wall + width:
                    break
                instant = self._second_instant(label)
                if instant is not None and instant > after:
                    best = instant if best is None else min(best, instant)
                    break
        return best

    def prev_before(self, at: datetime) -> datetime | None:
        wall, fold = self._wall(at)
        start = wall
        if fold == 1:  # first occurrences of the later repeated wall times are before `at` too
            o0, o1 = self._offsets(wall)
            start = wall + (o0 - o1)
        best: datetime | None = None
        best_label = wall
        for label in self._labels(start, reverse=True):
            instant = self._first_instant(label)
            if instant is not None and instant < at:
                best, best_label = instant, label
                break
        if best is None or not self._second_occurrence:
            return best
        o0, o1 = self._offsets(best_label)
        if o0 > o1:
            # The last first occurrence is in a fall-back window: second occurrences of labels within one
            # overlap width at or before it come after it, and may still be before `at`.
            width = o0 - o1
            for label in self._labels(best_label + _SECOND, reverse=True):
                if label <= best_label - width:
                    break
                instant = self._second_instant(label)
                if instant is not None and instant < at:
                    best = max(best, instant)
                    break
        return best


# ---------------------------------------------------------------------------------------------------------
# Timetable
# ---------------------------------------------------------------------------------------------------------


class Timetable:
    """Fire times of a timed ScheduleSpec (cron in its time zone, or a fixed interval)."""

    __slots__ = ("_fires", "spec")

    def __init__(self, spec: ScheduleSpec) -> None:
        """Build the timetable; ValueError if the spec is not a cron or interval schedule."""
        if not spec.is_timed:
            raise ValueError(f"kind: a timetable needs a cron or interval schedule, got {spec.kind!r}")
        self.spec = spec
        self._fires: _Fires
        if spec.kind == "cron":
            assert spec.cron is not None
            self._fires = _CronFires(spec.cron, ZoneInfo(spec.timezone), spec.dst_gap, spec.dst_overlap)
        else:
            assert spec.interval_s is not None
            anchor = spec.start_date if spec.start_date is not None else _EPOCH
            self._fires = _IntervalFires(anchor, spec.interval_s)

    def next_fire_after(self, after: datetime) -> datetime:
        """Return the first fire time strictly after `after` (UTC).

        Raises:
            ValueError: `after` is naive, or no fire time follows it (end of the calendar).
        """
        after = _aware_utc(after, "after")
        try:
            fire = self._fires.next_after(after)
        except OverflowError:
            fire = None
        if fire is None:
            raise ValueError(f"after: no fire time after {after.isoformat()}")
        if fire <= after:
            raise RuntimeError(f"timetable went backwards: {fire.isoformat()} <= {after.isoformat()}")
        return fire

    def prev_fire_before(self, at: datetime) -> datetime | None:
        """Return the last fire time strictly before `at` (UTC), or None if there is none."""
        at = _aware_utc(at, "at")
        try:
            fire = self._fires.prev_before(at)
        except OverflowError:
            return None
        if fire is not None and fire >= at:
            raise RuntimeError(f"timetable went forwards: {fire.isoformat()} >= {at.isoformat()}")
        return fire

    def _fire_at_or_before(self, at: datetime) -> datetime | None:
        return self.prev_fire_before(at + _US)

    def _fire_at_or_after(self, at: datetime) -> datetime | None:
        try:
            return self.next_fire_after(at - _US)
        except ValueError:
            return None

    def data_interval(self, fire: datetime) -> tuple[datetime, datetime]:
        """Return (start, end) = (previous fire time, `fire`): the data interval `fire` closes.

        Raises:
            ValueError: No fire time precedes `fire`.
        """
        fire = _aware_utc(fire, "fire")
        start = self.prev_fire_before(fire)
        if start is None:
            raise ValueError(f"fire: no fire time before {fire.isoformat()}, so it closes no data interval")
        return start, fire

    def allowed(self, fire: datetime) -> bool:
        """True if the run at `fire` has its logical date (data interval start) within start/end dates."""
        fire = _aware_utc(fire, "fire")
        start = self.prev_fire_before(fire)
        if start is None:
            return False
        spec = self.spec
        if spec.start_date is not None and start < spec.start_date:
            return False
        return spec.end_date is None or start <= spec.end_date

    def first_fire(self, not_before: datetime) -> datetime | None:
        """Return the first allowed fire time at or after `not_before`, or None if there is none.

        That is the smallest fire f >= not_before whose data interval starts at or after start_date;
        None when its logical date would be after end_date.
        """
        not_before = _aware_utc(not_before, "not_before")
        fire = self._fire_at_or_after(not_before)
        if self.spec.start_date is not None:
            opening = self._fire_at_or_after(self.spec.start_date)
            first = None if opening is None else self._next_or_none(opening)
            if first is None:
                return None
            if fire is None or fire < first:
                fire = first
        if fire is None:
            return None
        logical = self.prev_fire_before(fire)
        if logical is None:  # the anchor of an interval closes no data interval
            fire = self._next_or_none(fire)
            if fire is None:
                return None
            logical = self.prev_fire_before(fire)
        if logical is None or (self.spec.end_date is not None and logical > self.spec.end_date):
            return None
        return fire

    def _next_or_none(self, after: datetime) -> datetime | None:
        try:
            return self.next_fire_after(after)
        except ValueError:
            return None

    def latest_fire_at_or_before(self, at: datetime) -> datetime | None:
        """Return the latest allowed fire time <= `at` (see `allowed`), or None."""
        at = _aware_utc(at, "at")
        fire = self._fire_at_or_before(at)
        if fire is None:
            return None
        logical = self.prev_fire_before(fire)
        end = self.spec.end_date
        if logical is not None and end is not None and logical > end:
            # Step back to the fire that closes the interval starting at the last fire <= end_date.
            logical = self._fire_at_or_before(end)
            if logical is None:
                return None
            fire = self.next_fire_after(logical)
        if logical is None:
            return None
        if self.spec.start_date is not None and logical < self.spec.start_date:
            return None
        return fire

    def fires(self, after: datetime, *, until: datetime | None = None, limit: int) -> list[datetime]:
        """Return successive fire times strictly after `after`, up to `until` (inclusive), at most `limit`."""
        current = _aware_utc(after, "after")
        end = None if until is None else _aware_utc(until, "until")
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit!r}")
        out: list[datetime] = []
        while len(out) < limit:
            fire = self._next_or_none(current)
            if fire is None or (end is not None and fire > end):
                break
            out.append(fire)
            current = fire
        return out
