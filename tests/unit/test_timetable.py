"""Timetables: cron fire times across DST transitions, intervals, run semantics, schedule parsing."""

from __future__ import annotations

import bisect
import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from treadle.domain.timetable import PRESETS, ScheduleSpec, Timetable, parse_schedule

NY = "America/New_York"
LONDON = "Europe/London"
LORD_HOWE = "Australia/Lord_Howe"


def z(text: str) -> datetime:
    """A UTC instant written as 'YYYY-MM-DD HH:MM[:SS]'."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def table(schedule: Any, timezone: str = "UTC", **options: Any) -> Timetable:
    spec = parse_schedule(schedule, timezone=timezone, **options)
    assert spec is not None
    return Timetable(spec)


# --- the time zone facts the expected tables below were computed from -------------------------------------


@pytest.mark.parametrize(
    ("zone", "instant", "offset"),
    [
        (NY, "2026-03-08 06:59", timedelta(hours=-5)),
        (NY, "2026-03-08 07:00", timedelta(hours=-4)),  # 02:00 EST -> 03:00 EDT
        (NY, "2026-11-01 05:59", timedelta(hours=-4)),
        (NY, "2026-11-01 06:00", timedelta(hours=-5)),  # 02:00 EDT -> 01:00 EST
        (LONDON, "2026-03-29 00:59", timedelta(0)),
        (LONDON, "2026-03-29 01:00", timedelta(hours=1)),  # 01:00 GMT -> 02:00 BST
        (LONDON, "2026-10-25 00:59", timedelta(hours=1)),
        (LONDON, "2026-10-25 01:00", timedelta(0)),  # 02:00 BST -> 01:00 GMT
        (LORD_HOWE, "2026-04-04 14:59", timedelta(hours=11)),
        (LORD_HOWE, "2026-04-04 15:00", timedelta(hours=10, minutes=30)),  # 02:00 -> 01:30
        (LORD_HOWE, "2026-10-03 15:29", timedelta(hours=10, minutes=30)),
        (LORD_HOWE, "2026-10-03 15:30", timedelta(hours=11)),  # 02:00 -> 02:30
    ],
)
def test_zone_transitions_are_as_the_tables_assume(zone: str, instant: str, offset: timedelta) -> None:
    assert z(instant).astimezone(ZoneInfo(zone)).utcoffset() == offset


# --- hand-computed fire times across the 2026 transitions ------------------------------------------------

SKIP = {"dst_gap": "skip"}
BOTH = {"dst_overlap": "both"}
SKIP_BOTH = {"dst_gap": "skip", "dst_overlap": "both"}

# (zone, expression, options, after, expected fires after `after`) -- all UTC, computed by hand.
CASES: list[tuple[str, str, dict[str, str], str, list[str]]] = [
    # New York: gap 02:00-03:00 local on 03-08 (07:00Z), overlap 01:00-02:00 local on 11-01 (05:00Z-07:00Z).
    (NY, "30 2 * * *", {}, "2026-03-06 12:00",
     ["2026-03-07 07:30", "2026-03-08 07:00", "2026-03-09 06:30", "2026-03-10 06:30"]),
    (NY, "30 2 * * *", SKIP, "2026-03-06 12:00",
     ["2026-03-07 07:30", "2026-03-09 06:30", "2026-03-10 06:30"]),
    (NY, "0,30 2 * * *", {}, "2026-03-07 12:00",
     ["2026-03-08 07:00", "2026-03-09 06:00", "2026-03-09 06:30"]),  # both shift to 03:00 EDT: once
    (NY, "0,30 2 * * *", SKIP, "2026-03-07 12:00",
     ["2026-03-09 06:00", "2026-03-09 06:30", "2026-03-10 06:00"]),
    (NY, "*/30 2 * * *", {}, "2026-03-07 12:00",
     ["2026-03-09 06:00", "2026-03-09 06:30"]),  # wildcard minute: no fixed time, nothing to shift
    (NY, "30 1 * * *", {}, "2026-10-30 12:00",
     ["2026-10-31 05:30", "2026-11-01 05:30", "2026-11-02 06:30"]),
    (NY, "30 1 * * *", BOTH, "2026-10-30 12:00",
     ["2026-10-31 05:30", "2026-11-01 05:30", "2026-11-01 06:30", "2026-11-02 06:30"]),
    (NY, "0 9 * * *", {}, "2026-03-06 15:00", ["2026-03-07 14:00", "2026-03-08 13:00", "2026-03-09 13:00"]),
    (NY, "0 9 * * *", SKIP_BOTH, "2026-10-30 15:00",
     ["2026-10-31 13:00", "2026-11-01 14:00", "2026-11-02 14:00"]),
    (NY, "0,30 * * * *", {}, "2026-03-08 05:50",
     ["2026-03-08 06:00", "2026-03-08 06:30", "2026-03-08 07:00", "2026-03-08 07:30", "2026-03-08 08:00"]),
    (NY, "0,30 * * * *", SKIP_BOTH, "2026-11-01 04:45",
     ["2026-11-01 05:00", "2026-11-01 05:30", "2026-11-01 06:00", "2026-11-01 06:30", "2026-11-01 07:00",
      "2026-11-01 07:30"]),
    (NY, "15 * * * *", {}, "2026-03-08 05:00",
     ["2026-03-08 05:15", "2026-03-08 06:15", "2026-03-08 07:15", "2026-03-08 08:15"]),
    (NY, "15 * * * *", {}, "2026-11-01 04:00",
     ["2026-11-01 04:15", "2026-11-01 05:15", "2026-11-01 06:15", "2026-11-01 07:15"]),
    (NY, "0 */2 * * *", {}, "2026-03-08 04:00", ["2026-03-08 05:00", "2026-03-08 08:00", "2026-03-08 10:00"]),
    (NY, "0 */2 * * *", SKIP_BOTH, "2026-11-01 03:00",
     ["2026-11-01 04:00", "2026-11-01 07:00", "2026-11-01 09:00"]),
    # London: gap 01:00-02:00 local on 03-29 (01:00Z), overlap 01:00-02:00 local on 10-25 (00:00Z-02:00Z).
    (LONDON, "30 1 * * *", {}, "2026-03-27 12:00",
     ["2026-03-28 01:30", "2026-03-29 01:00", "2026-03-30 00:30"]),
    (LONDON, "30 1 * * *", SKIP, "2026-03-27 12:00",
     ["2026-03-28 01:30", "2026-03-30 00:30", "2026-03-31 00:30"]),
    (LONDON, "30 1 * * *", {}, "2026-10-23 12:00",
     ["2026-10-24 00:30", "2026-10-25 00:30", "2026-10-26 01:30"]),
    (LONDON, "30 1 * * *", BOTH, "2026-10-23 12:00",
     ["2026-10-24 00:30", "2026-10-25 00:30", "2026-10-25 01:30", "2026-10-26 01:30"]),
    (LONDON, "0 9 * * *", {}, "2026-03-27 12:00",
     ["2026-03-28 09:00", "2026-03-29 08:00", "2026-03-30 08:00"]),
    (LONDON, "0 9 * * *", {}, "2026-10-23 12:00",
     ["2026-10-24 08:00", "2026-10-25 09:00", "2026-10-26 09:00"]),
    (LONDON, "*/30 * * * *", SKIP_BOTH, "2026-03-29 00:00",
     ["2026-03-29 00:30", "2026-03-29 01:00", "2026-03-29 01:30", "2026-03-29 02:00"]),
    (LONDON, "*/30 * * * *", {}, "2026-10-25 00:00",
     ["2026-10-25 00:30", "2026-10-25 01:00", "2026-10-25 01:30", "2026-10-25 02:00"]),
    (LONDON, "15 * * * *", {}, "2026-03-28 23:30",
     ["2026-03-29 00:15", "2026-03-29 01:15", "2026-03-29 02:15"]),
    (LONDON, "15 * * * *", {}, "2026-10-24 23:30",
     ["2026-10-25 00:15", "2026-10-25 01:15", "2026-10-25 02:15"]),
    # Lord Howe (+10:30 standard, +11 DST): overlap 01:30-02:00 local on 04-05 (14:30Z-15:30Z),
    # gap 02:00-02:30 local on 10-04 (15:30Z).
    (LORD_HOWE, "15 2 * * *", {}, "2026-10-01 12:00",
     ["2026-10-01 15:45", "2026-10-02 15:45", "2026-10-03 15:30", "2026-10-04 15:15"]),
    (LORD_HOWE, "15 2 * * *", SKIP, "2026-10-01 12:00",
     ["2026-10-01 15:45", "2026-10-02 15:45", "2026-10-04 15:15", "2026-10-05 15:15"]),
    (LORD_HOWE, "45 1 * * *", {}, "2026-04-02 12:00",
     ["2026-04-02 14:45", "2026-04-03 14:45", "2026-04-04 14:45", "2026-04-05 15:15"]),
    (LORD_HOWE, "45 1 * * *", BOTH, "2026-04-02 12:00",
     ["2026-04-02 14:45", "2026-04-03 14:45", "2026-04-04 14:45", "2026-04-04 15:15", "2026-04-05 15:15"]),
    (LORD_HOWE, "0 9 * * *", {}, "2026-04-03 12:00",
     ["2026-04-03 22:00", "2026-04-04 22:30", "2026-04-05 22:30"]),
    (LORD_HOWE, "0 9 * * *", {}, "2026-10-02 12:00",
     ["2026-10-02 22:30", "2026-10-03 22:00", "2026-10-04 22:00"]),
    (LORD_HOWE, "*/30 * * * *", {}, "2026-04-04 14:00",
     ["2026-04-04 14:30", "2026-04-04 15:00", "2026-04-04 15:30", "2026-04-04 16:00"]),
    (LORD_HOWE, "*/30 * * * *", SKIP_BOTH, "2026-10-03 14:30",
     ["2026-10-03 15:00", "2026-10-03 15:30", "2026-10-03 16:00"]),
    (LORD_HOWE, "15 * * * *", {}, "2026-04-04 13:00",
     ["2026-04-04 13:15", "2026-04-04 14:15", "2026-04-04 15:45", "2026-04-04 16:45"]),
    (LORD_HOWE, "15 * * * *", {}, "2026-10-03 13:00",
     ["2026-10-03 13:45", "2026-10-03 14:45", "2026-10-03 16:15", "2026-10-03 17:15"]),
    (LORD_HOWE, "45 * * * *", {}, "2026-04-04 13:00",
     ["2026-04-04 13:45", "2026-04-04 14:45", "2026-04-04 15:15", "2026-04-04 16:15"]),
    # 02:00 +10:30 (15:30Z) is a real instant with hour 2: cronsim 2.8 itself skips it (it steps hours
    # by 3600 real seconds), the timetable does not.
    (LORD_HOWE, "0 */2 * * *", {}, "2026-04-04 12:00",
     ["2026-04-04 13:00", "2026-04-04 15:30", "2026-04-04 17:30"]),
    (LORD_HOWE, "0 */2 * * *", {}, "2026-10-03 12:00",
     ["2026-10-03 13:30", "2026-10-03 17:00", "2026-10-03 19:00"]),
]  # fmt: skip


def _case_id(case: tuple[str, str, dict[str, str], str, list[str]]) -> str:
    zone, expr, options, after, _ = case
    return f"{zone.split('/')[-1]}|{expr}|{','.join(options.values()) or 'default'}|{after}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_fire_times_across_dst(case: tuple[str, str, dict[str, str], str, list[str]]) -> None:
    zone, expr, options, after, expected = case
    tt = table(expr, zone, **options)
    want = [z(e) for e in expected]
    assert tt.fires(z(after), limit=len(want)) == want
    for fire in want:
        assert fire.tzinfo is UTC
    # the same instants seen backwards
    for earlier, later in itertools.pairwise(want):
        assert tt.prev_fire_before(later) == earlier
        assert tt.next_fire_after(earlier) == later
        assert tt.data_interval(later) == (earlier, later)


def test_fixed_time_after_a_second_occurrence_does_not_go_back() -> None:
    # 06:40Z is 01:40 EST, the second 01:40 of the day; 01:45 EDT (05:45Z) is already past.
    first = table("45 1 * * *", NY)
    assert first.next_fire_after(z("2026-11-01 06:40")) == z("2026-11-02 06:45")
    assert first.prev_fire_before(z("2026-11-01 06:40")) == z("2026-11-01 05:45")
    both = table("45 1 * * *", NY, dst_overlap="both")
    assert both.next_fire_after(z("2026-11-01 06:40")) == z("2026-11-01 06:45")
    assert both.prev_fire_before(z("2026-11-01 06:40")) == z("2026-11-01 05:45")
    assert both.prev_fire_before(z("2026-12-01 00:00")) == z("2026-11-30 06:45")
    yearly = table("30 1 1 11 *", NY, dst_overlap="both")
    assert yearly.prev_fire_before(z("2026-12-25 00:00")) == z("2026-11-01 06:30")
    assert yearly.fires(z("2026-01-01 00:00"), limit=3) == [
        z("2026-11-01 05:30"),
        z("2026-11-01 06:30"),
        z("2027-11-01 05:30"),  # 2027-11-01 is before that year's fall back (11-07): EDT
    ]


# --- default policy agrees with cronsim's own (Debian cron) iteration ------------------------------------

ORACLE_EXPRS = [
    "30 2 * * *",
    "30 1 * * *",
    "0,30 2 * * *",
    "45 1 * * *",
    "0 9 * * *",
    "*/30 * * * *",
    "15 * * * *",
]


@pytest.mark.parametrize("zone", [NY, LONDON, LORD_HOWE, "Asia/Beirut", "America/Santiago"])
@pytest.mark.parametrize("expr", ORACLE_EXPRS)
def test_default_policy_matches_cronsim(zone: str, expr: str) -> None:
    tt = table(expr, zone)
    for start in (z("2026-03-01 00:00"), z("2026-09-20 00:00")):
        reference = CronSim(expr, start.astimezone(ZoneInfo(zone)))
        expected = [next(reference).astimezone(UTC) for _ in range(300)]
        assert tt.fires(start, limit=300) == expected


# --- strictly increasing; next and prev agree ------------------------------------------------------------

MONOTONE = [
    (NY, "*/5 * * * *", {}, "2026-03-06 00:00"),
    (NY, "30 1 * * *", BOTH, "2026-01-01 00:00"),
    (NY, "0,30 2 * * *", {}, "2026-01-01 00:00"),
    (LONDON, "* * * * *", {}, "2026-10-24 12:00"),
    (LONDON, "30 1 * * *", SKIP_BOTH, "2026-01-01 00:00"),
    (LORD_HOWE, "*/15 * * * *", {}, "2026-04-03 12:00"),
    (LORD_HOWE, "15,45 1-2 * * *", SKIP_BOTH, "2026-01-01 00:00"),
    (LORD_HOWE, "0 */2 * * *", {}, "2026-03-20 00:00"),
]


@pytest.mark.parametrize(("zone", "expr", "options", "after"), MONOTONE)
def test_two_thousand_fires_strictly_increase(
    zone: str, expr: str, options: dict[str, str], after: str
) -> None:
    fires = table(expr, zone, **options).fires(z(after), limit=2000)
    assert len(fires) == 2000
    assert all(a < b for a, b in itertools.pairwise(fires))


TRANSITIONS = {
    NY: ["2026-03-08 07:00", "2026-11-01 06:00"],
    LONDON: ["2026-03-29 01:00", "2026-10-25 01:00"],
    LORD_HOWE: ["2026-04-04 15:00", "2026-10-03 15:30"],
}
FUZZ_EXPRS = ["*/30 * * * *", "15 * * * *", "30 1 * * *", "15 2 * * *", "45 1 * * *", "0,30 1-2 * * *"]


@pytest.mark.parametrize("options", [{}, SKIP_BOTH], ids=["default", "skip-both"])
@pytest.mark.parametrize("expr", FUZZ_EXPRS)
@pytest.mark.parametrize("zone", list(TRANSITIONS))
def test_next_and_prev_agree_around_transitions(zone: str, expr: str, options: dict[str, str]) -> None:
    tt = table(expr, zone, **options)
    for transition in TRANSITIONS[zone]:
        middle = z(transition)
        lo, hi = middle - timedelta(hours=30), middle + timedelta(hours=30)
        known = tt.fires(lo - timedelta(days=2), until=hi + timedelta(days=2), limit=10_000)
        assert all(a < b for a, b in itertools.pairwise(known))
        x = lo
        step = 0
        while x < hi:
            probes = [x, x + timedelta(seconds=13, microseconds=17)] if step % 5 == 0 else [x]
            for p in probes:
                nxt = tt.next_fire_after(p)
                prev = tt.prev_fire_before(p)
                assert prev is not None
                assert prev < p < nxt
                assert nxt == known[bisect.bisect_right(known, p)]
                assert prev == known[bisect.bisect_left(known, p) - 1]
                # next(prev(p)) is the first fire >= p; prev(next(p)) is the last fire <= p
                assert tt.next_fire_after(prev) == known[bisect.bisect_left(known, p)]
                assert tt.prev_fire_before(nxt) == known[bisect.bisect_right(known, p) - 1]
            # Every 7 minutes within 4 hours of the transition, where fires move or vanish; every
            # 37 minutes further out, where the probes only cross the neighbouring days' fires.
            x += timedelta(minutes=7 if abs(x - middle) < timedelta(hours=4) else 37)
            step += 1


def test_prev_fire_is_found_far_back_without_walking_from_the_epoch() -> None:
    leap = table("0 12 29 2 *", NY)
    assert leap.prev_fire_before(z("2026-07-01 00:00")) == z("2024-02-29 17:00")
    assert leap.next_fire_after(z("2026-07-01 00:00")) == z("2028-02-29 17:00")
    assert table("@hourly").prev_fire_before(z("2026-07-01 00:00:00.5")) == z("2026-07-01 00:00")


# --- presets and intervals -------------------------------------------------------------------------------


def test_presets_expand_to_cron() -> None:
    assert PRESETS == {
        "@hourly": "0 * * * *",
        "@daily": "0 0 * * *",
        "@midnight": "0 0 * * *",
        "@weekly": "0 0 * * 0",
        "@monthly": "0 0 1 * *",
        "@yearly": "0 0 1 1 *",
        "@annually": "0 0 1 1 *",
    }
    for preset, expr in PRESETS.items():
        spec = parse_schedule(preset)
        assert spec is not None and spec.kind == "cron" and spec.cron == expr
    assert table("@weekly").next_fire_after(z("2026-07-01 00:00")) == z("2026-07-05 00:00")  # a Sunday
    assert table("@monthly", "Asia/Tokyo").next_fire_after(z("2026-07-01 00:00")) == z("2026-07-31 15:00")
    assert table("@yearly").next_fire_after(z("2026-07-01 00:00")) == z("2027-01-01 00:00")
    spec = parse_schedule("  0  2 *  * mon ")
    assert spec is not None and spec.cron == "0 2 * * MON"


def test_one_second_interval_fires_on_whole_seconds() -> None:
    tt = table(1)
    assert tt.fires(z("2026-01-01 00:00:00.5"), limit=3) == [
        z("2026-01-01 00:00:01"),
        z("2026-01-01 00:00:02"),
        z("2026-01-01 00:00:03"),
    ]
    assert tt.prev_fire_before(z("2026-01-01 00:00:01.5")) == z("2026-01-01 00:00:01")
    assert tt.prev_fire_before(z("2026-01-01 00:00:01")) == z("2026-01-01 00:00:00")
    assert tt.next_fire_after(z("2026-01-01 00:00:01")) == z("2026-01-01 00:00:02")


def test_interval_anchor_defaults_to_the_epoch() -> None:
    assert table(timedelta(hours=1)).next_fire_after(z("2026-05-05 10:20:30")) == z("2026-05-05 11:00")
    # 90 minutes divides a day, so 90-minute fires land on 00:00, 01:30, ... UTC every day.
    assert table(5400).fires(z("2026-01-01 00:00"), limit=2) == [z("2026-01-01 01:30"), z("2026-01-01 03:00")]
    assert table(2.5).next_fire_after(z("1970-01-01 00:00:01")) == z("1970-01-01 00:00:02.5")
    assert table(60).prev_fire_before(z("1970-01-01 00:00")) is None
    # intervals are UTC arithmetic: the time zone and DST do not move them
    daily = table(timedelta(days=1), NY)
    assert daily.fires(z("2026-03-07 12:00"), limit=2) == [z("2026-03-08 00:00"), z("2026-03-09 00:00")]


def test_interval_anchored_at_start_date() -> None:
    tt = table(timedelta(minutes=90), start_date="2026-01-01T00:10:00Z")
    assert tt.fires(z("2026-01-01 00:00"), limit=3) == [
        z("2026-01-01 00:10"),
        z("2026-01-01 01:40"),
        z("2026-01-01 03:10"),
    ]
    assert tt.prev_fire_before(z("2026-01-01 00:10")) is None
    assert tt.prev_fire_before(z("2025-06-01 00:00")) is None
    assert tt.prev_fire_before(z("2026-01-01 03:09")) == z("2026-01-01 01:40")
    assert tt.first_fire(z("2025-12-31 00:00")) == z("2026-01-01 01:40")
    assert tt.data_interval(z("2026-01-01 01:40")) == (z("2026-01-01 00:10"), z("2026-01-01 01:40"))
    assert not tt.allowed(z("2026-01-01 00:10"))
    assert tt.allowed(z("2026-01-01 01:40"))
    with pytest.raises(ValueError, match="no fire time before"):
        tt.data_interval(z("2026-01-01 00:10"))


# --- run semantics ----------------------------------------------------------------------------------------


def test_the_2026_07_04_run_of_a_daily_schedule_in_singapore() -> None:
    tt = table("0 2 * * *", "Asia/Singapore")
    fire = tt.next_fire_after(z("2026-07-04 12:00"))
    assert fire == z("2026-07-04 18:00")  # 2026-07-05 02:00 +08:00
    start, end = tt.data_interval(fire)
    assert (start, end) == (z("2026-07-03 18:00"), z("2026-07-04 18:00"))
    sg = ZoneInfo("Asia/Singapore")
    assert start.astimezone(sg).replace(tzinfo=None) == datetime(2026, 7, 4, 2, 0)  # logical date
    assert end.astimezone(sg).replace(tzinfo=None) == datetime(2026, 7, 5, 2, 0)


def test_start_and_end_dates_bound_logical_dates() -> None:
    tt = table("@daily", start_date="2026-01-10", end_date="2026-01-20")
    assert tt.spec.start_date == z("2026-01-10 00:00") and tt.spec.end_date == z("2026-01-20 00:00")
    assert tt.first_fire(z("2026-01-01 00:00")) == z("2026-01-11 00:00")  # logical date 01-10
    assert tt.first_fire(z("2026-01-15 12:00")) == z("2026-01-16 00:00")
    assert tt.first_fire(z("2026-01-21 00:00")) == z("2026-01-21 00:00")  # logical date 01-20 == end
    assert tt.first_fire(z("2026-01-21 00:00:01")) is None
    assert not tt.allowed(z("2026-01-10 00:00"))
    assert tt.allowed(z("2026-01-11 00:00"))
    assert tt.allowed(z("2026-01-21 00:00"))
    assert not tt.allowed(z("2026-01-22 00:00"))
    assert tt.latest_fire_at_or_before(z("2026-01-15 12:00")) == z("2026-01-15 00:00")
    assert tt.latest_fire_at_or_before(z("2026-01-15 00:00")) == z("2026-01-15 00:00")  # inclusive
    assert tt.latest_fire_at_or_before(z("2026-03-01 00:00")) == z("2026-01-21 00:00")
    assert tt.latest_fire_at_or_before(z("2026-01-11 00:00")) == z("2026-01-11 00:00")
    assert tt.latest_fire_at_or_before(z("2026-01-10 23:59")) is None


def test_start_date_between_fires_and_in_a_time_zone() -> None:
    tt = table("@daily", start_date="2026-01-10T12:00:00Z")
    assert tt.first_fire(z("2020-01-01 00:00")) == z("2026-01-12 00:00")  # first interval starts 01-11
    ny = table("0 2 * * *", NY, start_date=datetime(2026, 7, 1))  # naive: 2026-07-01 00:00 EDT
    assert ny.spec.start_date == z("2026-07-01 04:00")
    assert ny.first_fire(z("2026-01-01 00:00")) == z("2026-07-02 06:00")  # logical 07-01 02:00 EDT
    assert ny.latest_fire_at_or_before(z("2026-07-02 05:59")) is None


def test_unbounded_schedule_allows_every_fire() -> None:
    tt = table("0 * * * *")
    assert tt.latest_fire_at_or_before(z("2026-07-01 10:30")) == z("2026-07-01 10:00")
    assert tt.first_fire(z("2026-07-01 10:30")) == z("2026-07-01 11:00")
    assert tt.allowed(z("2026-07-01 11:00"))
    assert tt.fires(z("2026-07-01 10:30"), until=z("2026-07-01 13:00"), limit=10) == [
        z("2026-07-01 11:00"),
        z("2026-07-01 12:00"),
        z("2026-07-01 13:00"),
    ]
    assert tt.fires(z("2026-07-01 10:30"), limit=0) == []


def test_naive_instants_are_rejected() -> None:
    tt = table("@daily")
    naive = datetime(2026, 1, 1)
    for call in (tt.next_fire_after, tt.prev_fire_before, tt.latest_fire_at_or_before, tt.first_fire):
        with pytest.raises(ValueError, match="naive"):
            call(naive)
    with pytest.raises(ValueError, match="start_date must be timezone-aware"):
        ScheduleSpec(kind="cron", cron="0 0 * * *", start_date=naive)


# --- parse_schedule ----------------------------------------------------------------------------------------


def test_parse_schedule_kinds_and_dates() -> None:
    assert parse_schedule(None) is None
    interval = parse_schedule(timedelta(minutes=5))
    assert interval is not None and interval.kind == "interval" and interval.interval_s == 300.0
    assert interval.is_timed
    datasets = parse_schedule(["orders", "customers", "orders"])
    assert (
        datasets is not None and datasets.kind == "dataset" and datasets.datasets == ("customers", "orders")
    )
    assert not datasets.is_timed
    with pytest.raises(ValueError, match="cron or interval"):
        Timetable(datasets)
    aware = parse_schedule("@daily", start_date="2026-07-01T00:00:00+02:00", end_date="2026-08-01T00:00Z")
    assert aware is not None
    assert aware.start_date == z("2026-06-30 22:00") and aware.end_date == z("2026-08-01 00:00")
    local = parse_schedule(
        "@daily", timezone=NY, start_date="2026-07-01", end_date=datetime(2026, 8, 1, 6, 30)
    )
    assert local is not None
    assert local.start_date == z("2026-07-01 04:00") and local.end_date == z("2026-08-01 10:30")
    assert parse_schedule("@DAILY") == parse_schedule("0 0 * * *")


@pytest.mark.parametrize(
    ("schedule", "options", "fragments"),
    [
        ("61 * * * *", {}, ["schedule", "'61 * * * *'", "Bad minute"]),
        ("0 25 * * *", {}, ["schedule", "'0 25 * * *'", "Bad hour"]),
        ("* * * *", {}, ["schedule", "'* * * *'", "expected 5 fields", "got 4"]),
        ("@fortnightly", {}, ["schedule", "'@fortnightly'", "@daily", "@hourly", "@yearly"]),
        ("@daily", {"timezone": "Mars/Olympus_Mons"}, ["timezone", "unknown time zone 'Mars/Olympus_Mons'"]),
        ("@daily", {"timezone": ""}, ["timezone", "unknown time zone ''"]),
        (
            "@daily",
            {"start_date": "2026-02-01", "end_date": "2026-01-01"},
            ["end_date 2026-01-01T00:00:00+00:00", "before start_date 2026-02-01T00:00:00+00:00"],
        ),
        ("@daily", {"start_date": "yesterday"}, ["start_date", "'yesterday'"]),
        ("@daily", {"max_active_runs": 0}, ["max_active_runs", "got 0"]),
        ("@daily", {"dst_gap": "later"}, ["dst_gap", "shift", "skip", "'later'"]),
        ("@daily", {"dst_overlap": "twice"}, ["dst_overlap", "first", "both", "'twice'"]),
        (0, {}, ["schedule", "interval", "greater than zero", "got 0"]),
        (-5.0, {}, ["schedule", "interval", "got -5.0"]),
        (timedelta(0), {}, ["schedule", "interval", "got 0.0"]),
        ([], {}, ["schedule", "dataset", "got []"]),
        (["orders", ""], {}, ["schedule", "dataset", "''"]),
        (True, {}, ["schedule", "True"]),
    ],
)
def test_parse_schedule_errors_name_field_and_value(
    schedule: Any, options: dict[str, Any], fragments: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        parse_schedule(schedule, **options)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message


# --- JSON form ---------------------------------------------------------------------------------------------


def test_schedule_spec_json_round_trip() -> None:
    specs = [
        parse_schedule(
            "30 2 * * 1-5",
            timezone=NY,
            start_date="2026-01-01",
            end_date="2027-01-01T00:00Z",
            catchup=True,
            max_active_runs=3,
            dst_gap="skip",
            dst_overlap="both",
        ),
        parse_schedule(timedelta(minutes=90), start_date="2026-01-01T00:10Z"),
        parse_schedule(["b", "a"]),
        parse_schedule("@hourly"),
    ]
    keys = None
    for spec in specs:
        assert spec is not None
        data = spec.to_json()
        keys = keys or set(data)
        assert set(data) == keys
        assert ScheduleSpec.from_json(json.loads(json.dumps(data))) == spec
    first = specs[0]
    assert first is not None
    assert first.to_json() == {
        "kind": "cron",
        "cron": "30 2 * * 1-5",
        "interval_s": None,
        "timezone": NY,
        "dst_gap": "skip",
        "dst_overlap": "both",
        "start_date": "2026-01-01T05:00:00+00:00",
        "end_date": "2027-01-01T00:00:00+00:00",
        "catchup": True,
        "max_active_runs": 3,
        "datasets": [],
    }
