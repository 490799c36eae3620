"""Backfill planning without a database: ranges, interval actions, the dry run, the drain's next intervals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from treadle.domain import backfill_plan as bp
from treadle.domain.records import RunInfo
from treadle.domain.timetable import ScheduleSpec, Timetable
from treadle.errors import InvalidRequest

HOUR = timedelta(hours=1)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + 10 * HOUR + 30 * timedelta(minutes=1)


def _hourly(
    *, start_date: datetime | None = None, end_date: datetime | None = None, max_active_runs: int = 16
) -> ScheduleSpec:
    return ScheduleSpec(
        kind="cron",
        cron="0 * * * *",
        start_date=start_date,
        end_date=end_date,
        max_active_runs=max_active_runs,
    )


def _run(logical: datetime, state: str) -> RunInfo:
    return RunInfo(
        run_id=f"r-{logical:%H}",
        dag_id="d",
        dag_version_id=1,
        run_type="scheduled",
        logical_date=logical,
        state=state,
        conf={},
        triggered_by="scheduler",
        created_at=logical,
        started_at=None,
        ended_at=None,
    )


def _range(
    spec: ScheduleSpec,
    *,
    from_date: datetime = T0,
    to_date: datetime = T0 + 3 * HOUR,
    max_active: int | None = None,
    max_span_days: float = 366.0,
) -> bp.BackfillRange:
    return bp.check_range(
        "d",
        spec,
        from_date=from_date,
        to_date=to_date,
        max_active=max_active,
        max_span_days=max_span_days,
        now=NOW,
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-01-01", datetime(2026, 1, 1, tzinfo=ZoneInfo("Europe/Paris"))),
        ("2026-01-01T12:00:00+00:00", datetime(2026, 1, 1, 12, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12), datetime(2026, 1, 1, 12, tzinfo=ZoneInfo("Europe/Paris"))),
    ],
)
def test_read_date_reads_naive_values_in_the_zone(value: str | datetime, expected: datetime) -> None:
    got = bp.read_date(value, ZoneInfo("Europe/Paris"), "--from")
    assert got == expected
    assert got.tzinfo is UTC


def test_read_date_rejects_text_that_is_no_date() -> None:
    with pytest.raises(InvalidRequest, match="--to 'soon' is not an ISO-8601"):
        bp.read_date("soon", ZoneInfo("UTC"), "--to")


@pytest.mark.parametrize(
    ("reason", "mode", "rerun", "problem"),
    [
        ("  ", "normal", "none", "needs a reason"),
        ("x" * (bp.MAX_REASON_CHARS + 1), "normal", "none", "longer than the limit"),
        ("why", "loud", "none", "mode must be one of"),
        ("why", "normal", "some", "rerun must be one of"),
    ],
)
def test_check_options_names_the_problem(reason: str, mode: str, rerun: str, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        bp.check_options(reason=reason, mode=mode, rerun=rerun)


def test_check_options_strips_the_reason() -> None:
    assert bp.check_options(reason="  late data \n", mode="shadow", rerun="all") == "late data"


def test_check_range_takes_ended_intervals_only() -> None:
    checked = _range(_hourly(), to_date=T0 + 20 * HOUR, max_active=2)
    assert [logical for logical, _ in checked.intervals] == [T0 + n * HOUR for n in range(10)]
    assert all(fire == logical + HOUR for logical, fire in checked.intervals)
    assert checked.open_left_out
    assert checked.max_active == 2


def test_check_range_defaults_max_active_to_the_dags_limit() -> None:
    assert _range(_hourly(max_active_runs=3)).max_active == 3


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"from_date": T0 + HOUR, "to_date": T0}, "is after --to"),
        ({"to_date": T0 + timedelta(days=3)}, "more than the limit of 2 days"),
        ({"max_active": 0}, "--max-active must be between 1"),
        ({"max_active": 17}, "--max-active must be between 1"),
        ({"from_date": T0 + 11 * HOUR, "to_date": T0 + 12 * HOUR}, "intervals still open"),
    ],
)
def test_check_range_names_the_problem(kw: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        _range(_hourly(), max_span_days=2.0, **kw)


def test_check_range_stays_within_the_dags_start_and_end_dates() -> None:
    spec = _hourly(start_date=T0 + 2 * HOUR, end_date=T0 + 3 * HOUR)
    checked = _range(spec, to_date=T0 + 8 * HOUR)
    assert [logical for logical, _ in checked.intervals] == [T0 + 2 * HOUR, T0 + 3 * HOUR]
    with pytest.raises(InvalidRequest, match="its schedule starts at"):
        _range(spec, to_date=T0 + HOUR)


@pytest.mark.parametrize(
    ("rerun", "state", "action"),
    [
        ("none", None, bp.CREATE),
        ("none", "failed", bp.SKIP_EXISTING),
        ("failed", "failed", bp.RERUN_FAILED),
        ("failed", "success", bp.SKIP_EXISTING),
        ("all", "success", bp.RERUN_ALL),
        ("all", "running", bp.SKIP_ACTIVE),
    ],
)
def test_interval_action(rerun: str, state: str | None, action: str) -> None:
    existing = None if state is None else _run(T0, state)
    assert bp.interval_action(rerun, existing) == action


def test_dry_run_lists_each_interval_with_its_action() -> None:
    spec = _hourly()
    checked = _range(spec)
    plan = bp.dry_run(
        "d",
        spec,
        checked=checked,
        existing={T0 + HOUR: _run(T0 + HOUR, "failed")},
        reason="why",
        mode="normal",
        rerun="failed",
        dag_paused=True,
    )
    assert plan.total == 4
    assert [i.action for i in plan.intervals] == [bp.CREATE, bp.RERUN_FAILED, bp.CREATE, bp.CREATE]
    assert plan.actions == {bp.CREATE: 3, bp.RERUN_FAILED: 1}
    assert plan.intervals[1].existing_run_id == "r-01"
    assert plan.dag_paused and not plan.open_intervals_left_out


def test_next_intervals_go_from_the_cursor_until_the_range_ends() -> None:
    table = Timetable(_hourly())
    taken, after = bp.next_intervals(table, cursor=T0 + 3 * HOUR, remaining=2, to_date=T0 + 8 * HOUR, now=NOW)
    assert taken == [(T0 + 2 * HOUR, T0 + 3 * HOUR), (T0 + 3 * HOUR, T0 + 4 * HOUR)]
    assert after is None


def test_next_intervals_wait_for_an_interval_still_open() -> None:
    table = Timetable(_hourly())
    taken, after = bp.next_intervals(
        table, cursor=T0 + 10 * HOUR, remaining=5, to_date=T0 + 20 * HOUR, now=NOW
    )
    assert taken == [(T0 + 9 * HOUR, T0 + 10 * HOUR)]
    assert after == T0 + 11 * HOUR


@pytest.mark.parametrize("zone", ["UTC", "Asia/Singapore", "America/Los_Angeles", "Europe/Paris"])
def test_a_to_date_alone_takes_in_every_logical_date_of_that_day_in_the_dags_zone(zone: str) -> None:
    tz = ZoneInfo(zone)
    # 23:30 each day: the last logical date of the --to day, on either side of a DST change.
    spec = ScheduleSpec(kind="cron", cron="30 23 * * *", timezone=zone, max_active_runs=16)
    now = datetime(2026, 3, 20, tzinfo=UTC)

    checked = bp.check_range(
        "d", spec, from_date="2026-03-01", to_date="2026-03-10", max_active=None, max_span_days=366, now=now
    )

    local = [logical.astimezone(tz) for logical, _ in checked.intervals]
    assert [(d.day, d.hour, d.minute) for d in local] == [(day, 23, 30) for day in range(1, 11)]
    assert checked.to_date == datetime(2026, 3, 11, tzinfo=tz).astimezone(UTC) - timedelta(microseconds=1)


def test_a_to_date_with_a_time_is_that_instant_and_a_from_date_alone_starts_its_day() -> None:
    spec = ScheduleSpec(kind="cron", cron="0 2 * * *", timezone="Asia/Singapore", max_active_runs=16)
    now = datetime(2026, 3, 20, tzinfo=UTC)
    checked = bp.check_range(
        "d",
        spec,
        from_date="2026-03-01",
        to_date="2026-03-03T01:59:59",
        max_active=None,
        max_span_days=366,
        now=now,
    )
    tz = ZoneInfo("Asia/Singapore")
    assert [logical.astimezone(tz).day for logical, _ in checked.intervals] == [1, 2]
    assert bp.read_date("2026-03-01", tz, "--from", whole_day=False) == datetime(2026, 3, 1, tzinfo=tz)
