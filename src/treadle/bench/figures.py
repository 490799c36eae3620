"""Pure arithmetic on measured durations and recorded timestamps (no I/O, no clock)."""

from __future__ import annotations

import math
import statistics
from datetime import datetime

#: A span shorter than this counts as this long (SQLite stamps whole milliseconds).
MIN_SPAN_S = 0.001


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100) of a non-empty list: the smallest value with at
    least pct % of the values at or below it."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(math.ceil(pct * len(ordered) / 100), 1)
    return ordered[min(rank, len(ordered)) - 1]


def dist_ms(values_s: list[float]) -> dict[str, float | int]:
    """Count, p50 / p90 / p95 / p99 (nearest rank), min and max of durations in seconds, in ms."""
    if not values_s:
        return {"count": 0}
    ordered = sorted(values_s)
    figures: dict[str, float | int] = {"count": len(ordered)}
    for pct in (50, 90, 95, 99):
        figures[f"p{pct}_ms"] = round(percentile(ordered, pct) * 1000, 2)
    figures["min_ms"] = round(ordered[0] * 1000, 2)
    figures["max_ms"] = round(ordered[-1] * 1000, 2)
    return figures


def summary_ms(values_s: list[float]) -> dict[str, float]:
    """Median, p95, min and max of durations in seconds, as milliseconds."""
    if not values_s:
        return {}
    return {
        "median_ms": round(statistics.median(values_s) * 1000, 2),
        "p95_ms": round(percentile(values_s, 95) * 1000, 2),
        "min_ms": round(min(values_s) * 1000, 2),
        "max_ms": round(max(values_s) * 1000, 2),
    }


def rates_by_share(start: datetime, ends: list[datetime], parts: int = 10) -> list[float]:
    """Tasks per second in each of `parts` consecutive shares of a run's completions.

    The completions (`ends`) are sorted and cut into `parts` groups of (nearly) equal size;
    a group's span runs from the previous group's last end (the first group: from `start`, the
    run's first start) to its own last end. A run whose cost per task does not grow with its
    size keeps the same rate from the first share to the last (the last may dip while the
    final tasks drain with slots idle).
    """
    if parts < 1:
        raise ValueError("parts must be at least 1")
    ordered = sorted(ends)
    n = len(ordered)
    if n < parts:
        return []
    rates = []
    previous = start
    for k in range(parts):
        lo, hi = k * n // parts, (k + 1) * n // parts
        last = ordered[hi - 1]
        span = max((last - previous).total_seconds(), MIN_SPAN_S)
        rates.append(round((hi - lo) / span, 1))
        previous = last
    return rates


def second_half_over_first(start: datetime, ends: list[datetime]) -> float | None:
    """Rate of the second half of a run's completions over the rate of the first half.

    1.0: flat; below 1: later tasks cost more (e.g. a claim that slows as rows pile up).
    None for fewer than two completions.
    """
    halves = rates_by_share(start, ends, parts=2)
    if len(halves) < 2 or halves[0] == 0:
        return None
    return round(halves[1] / halves[0], 3)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator rounded to 0.001, or None if either is missing or zero."""
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)
