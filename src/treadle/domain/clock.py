"""Clock skew between a host and the database, judged only from round trips short enough to bound it.

Pure: callers read the clocks and pass the readings in; nothing here reads a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

#: A round trip longer than this fraction of the allowed skew is no evidence. A quarter keeps the
#: uncertainty (half the round trip) within an eighth of the allowed skew, so a verdict can be
#: off by at most 12.5% of the limit, whatever limit the deployment sets.
MAX_ROUND_TRIP_FRACTION = 0.25


class SkewVerdict(enum.Enum):
    """What the readings say about this host's clock."""

    WITHIN = "within"  #: the skew is certainly within the limit
    TOO_LARGE = "too_large"  #: the skew certainly exceeds the limit, even allowing for the round trip
    UNKNOWN = "unknown"  #: no round trip was short enough to tell


@dataclass(frozen=True, slots=True, kw_only=True)
class SkewSample:
    """One reading of the database clock with the host clock read just before and just after it."""

    #: Host wall-clock time before the query was sent, epoch seconds.
    host_before_s: float
    #: Database clock as the query returned it, epoch seconds.
    db_s: float
    #: Host wall-clock time after the reply arrived, epoch seconds.
    host_after_s: float

    @property
    def round_trip_s(self) -> float:
        """Host time the reading took (negative if the host clock stepped back meanwhile)."""
        return self.host_after_s - self.host_before_s

    @property
    def skew_s(self) -> float:
        """Database minus host clock, taking the database read as made mid-way through the round trip."""
        return self.db_s - (self.host_before_s + self.host_after_s) / 2


@dataclass(frozen=True, slots=True, kw_only=True)
class SkewJudgement:
    """The verdict, and the sample it rests on (None when UNKNOWN)."""

    verdict: SkewVerdict
    #: Estimated database-minus-host difference, seconds.
    skew_s: float | None = None
    #: The estimate is exact within plus or minus this, seconds (half the round trip).
    uncertainty_s: float | None = None
    #: Shortest round trip among the samples (None if there were none), seconds.
    best_round_trip_s: float | None = None


def max_round_trip_s(max_skew_s: float) -> float:
    """Longest round trip whose reading counts as evidence about a skew limit of `max_skew_s`."""
    return max_skew_s * MAX_ROUND_TRIP_FRACTION


def judge_skew(samples: Iterable[SkewSample], *, max_skew_s: float) -> SkewJudgement:
    """Judge the skew from the sample with the shortest round trip, if any is short enough.

    The true skew lies within `skew_s ± round_trip_s / 2`; it is TOO_LARGE only when even the
    nearest end of that interval exceeds `max_skew_s`. A round trip longer than
    `max_round_trip_s(max_skew_s)` (a stalled database, a busy host) or negative (the host clock
    stepped during the read) bounds nothing, so it is UNKNOWN, never TOO_LARGE.
    """
    ordered = sorted((s for s in samples if s.round_trip_s >= 0), key=lambda s: s.round_trip_s)
    best = ordered[0] if ordered else None
    if best is None or best.round_trip_s > max_round_trip_s(max_skew_s):
        return SkewJudgement(
            verdict=SkewVerdict.UNKNOWN, best_round_trip_s=None if best is None else best.round_trip_s
        )
    uncertainty = best.round_trip_s / 2
    too_large = abs(best.skew_s) - uncertainty > max_skew_s
    return SkewJudgement(
        verdict=SkewVerdict.TOO_LARGE if too_large else SkewVerdict.WITHIN,
        skew_s=best.skew_s,
        uncertainty_s=uncertainty,
        best_round_trip_s=best.round_trip_s,
    )
