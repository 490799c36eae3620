"""`Alert(...)`: an alert rule as DAG authors write it (durations as text), checked into the
stored `AlertRule` (domain/alerts.py).

    @dag(alerts=[Alert("consecutive_failures", count=3, severity="critical"),
                 Alert("run_over_budget", budget="2h"),
                 Alert("dead_letter", tasks=["load"], backfills=True)])
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from treadle.domain.alerts import AlertRule, duration_s
from treadle.errors import DagDefinitionError


def Alert(  # named like a class: it reads as one at the call site, like Dataset and Param
    kind: str,
    *,
    tasks: Sequence[str] = (),
    severity: str | None = None,
    count: int | None = None,
    budget: timedelta | float | str | None = None,
    dedup: timedelta | float | str | None = None,
    backfills: bool = False,
) -> AlertRule:
    """An alert rule of a DAG. `kind`: dead_letter, needs_inspection, quality_gate_failed,
    freshness_miss, consecutive_failures (`count` failed runs in a row, default 3),
    run_over_budget (`budget`), repeated_retries (`count` retries of one task instance, default
    3), sensor_timeout, backfill_over_budget (`budget`). `tasks` limits a task kind to those
    tasks; `severity` (info, warning, error, critical) overrides the kind's; `dedup` is the
    window repeats about the same subject are not sent again in (default: the deployment's);
    `backfills=True` also alerts about backfill runs. DagDefinitionError names the problem."""
    try:
        return AlertRule(
            kind=kind,  # type: ignore[arg-type]  # text, validated into an AlertKind
            tasks=tuple(tasks),
            severity=severity,  # type: ignore[arg-type]  # text, validated into a Severity
            count=count,
            budget_s=None if budget is None else duration_s(budget, f"alert {kind}: budget"),
            dedup_s=None if dedup is None else duration_s(dedup, f"alert {kind}: dedup"),
            backfills=backfills,
        )
    except ValueError as exc:
        raise DagDefinitionError(str(exc)) from None
