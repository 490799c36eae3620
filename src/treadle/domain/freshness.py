"""Freshness SLO misses: which outputs are older than their DAG's `freshness_slo`, and the
period each miss belongs to.

Pure: the leader reads the newest event of each output and the clock, this decides. A miss's
period is the newest event it is about: the output stays missed until a new version is
published, and one period is alerted once. An output never published has no age and is not a
miss here (`treadle datasets freshness` shows it; its producer's failures alert on their own).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetSlo:
    """The SLOs a dataset declares itself (they replace its DAG's for that output)."""

    dataset: str
    freshness_slo_s: float | None = None
    #: "HH:MM <zone>".
    published_by: str | None = None

    def to_json(self) -> dict[str, object]:
        """The stored form."""
        out: dict[str, object] = {"dataset": self.dataset}
        if self.freshness_slo_s is not None:
            out["freshness_slo_s"] = self.freshness_slo_s
        if self.published_by is not None:
            out["published_by"] = self.published_by
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """One output of a DAG with a freshness SLO, as the leader reads it."""

    dag_id: str
    dataset: str
    slo_s: float | None
    last_event_at: datetime | None
    #: "published by HH:MM <zone>" each day, if the DAG declares it.
    deadline: Deadline | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Miss:
    """An output older than its SLO (or never published)."""

    dag_id: str
    dataset: str
    slo_s: float | None
    #: Seconds since the newest event.
    age_s: float
    period: str
    #: The deadline missed (ISO 8601 instant), for a "published by" miss; None for a max-age one.
    deadline_at: str | None = None

    @property
    def key(self) -> str:
        """The identity of this miss: alerted once."""
        text = "\0".join((self.dag_id, self.dataset, self.period))
        return hashlib.sha256(text.encode()).hexdigest()


def misses(outputs: list[Output], *, now: datetime) -> list[Miss]:
    """The outputs that miss their SLO at `now` (max age, then deadline), in the order given."""
    found = []
    for o in outputs:
        if o.last_event_at is None:
            continue
        age = (now - o.last_event_at).total_seconds()
        if o.slo_s is not None and age > o.slo_s:
            period = o.last_event_at.isoformat()
            found.append(Miss(dag_id=o.dag_id, dataset=o.dataset, slo_s=o.slo_s, age_s=age, period=period))
        if o.deadline is not None:
            due = o.deadline.latest_at_or_before(now)
            if o.last_event_at < o.deadline.previous(due):
                found.append(
                    Miss(
                        dag_id=o.dag_id,
                        dataset=o.dataset,
                        slo_s=o.slo_s,
                        age_s=age,
                        period=f"by {due.isoformat()}",
                        deadline_at=due.isoformat(),
                    )
                )
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadline:
    """ "Published by HH:MM in `zone`" each day: a new version between one day's deadline and the
    next's. Each day's instant is the wall-clock time in the zone (zoneinfo: a deadline in a
    daylight-saving gap falls at the same offset as before the gap, one in an overlap at its
    first occurrence)."""

    hour: int
    minute: int
    zone: str

    @staticmethod
    def parse(text: str) -> Deadline:
        """ "06:00 Asia/Jakarta" (the zone defaults to UTC); ValueError naming the problem."""
        clock, _, zone = text.strip().partition(" ")
        zone = zone.strip() or "UTC"
        hh, sep, mm = clock.partition(":")
        if not (
            sep and hh.isdigit() and mm.isdigit() and len(mm) == 2 and 0 <= int(hh) <= 23 and int(mm) < 60
        ):
            raise ValueError(
                f"published_by must be 'HH:MM <time zone>' such as '06:00 Asia/Jakarta', got {text!r}"
            )
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"published_by: unknown time zone {zone!r} (an IANA name such as Asia/Jakarta)"
            ) from None
        return Deadline(hour=int(hh), minute=int(mm), zone=zone)

    def __str__(self) -> str:
        return f"{self.hour:02d}:{self.minute:02d} {self.zone}"

    def on(self, day: date) -> datetime:
        """The deadline of the local `day`, as an aware instant."""
        return datetime.combine(day, time(self.hour, self.minute), tzinfo=ZoneInfo(self.zone))

    def latest_at_or_before(self, now: datetime) -> datetime:
        """The newest deadline that has passed at `now` (or is `now`)."""
        today = now.astimezone(ZoneInfo(self.zone)).date()
        due = self.on(today)
        return due if due <= now else self.on(today - timedelta(days=1))

    def previous(self, due: datetime) -> datetime:
        """The deadline of the day before `due`'s."""
        return self.on(due.astimezone(ZoneInfo(self.zone)).date() - timedelta(days=1))

    def next_after(self, now: datetime) -> datetime:
        """The first deadline after `now`."""
        return self.on(
            self.latest_at_or_before(now).astimezone(ZoneInfo(self.zone)).date() + timedelta(days=1)
        )
