"""Outbox entries and the relay's decisions: when to try an entry again, when it is dead.

Pure: the relay and the store do the I/O; this module decides from the attempt count and `rand`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class OutboxState(StrEnum):
    """Where an outbox entry is."""

    PENDING = "pending"
    DELIVERED = "delivered"
    #: Delivery failed `max_attempts` times; waits for an operator (`treadle outbox replay`).
    DEAD = "dead"


class OutboxKind(StrEnum):
    """What an entry tells the world."""

    DATASET_PUBLISHED = "dataset.published"
    TASK_DEAD_LETTER = "task.dead_letter"
    #: A DAG's output older than its freshness SLO (engine/freshness.py).
    FRESHNESS_MISS = "freshness.miss"
    #: An OpenLineage run event (domain/lineage.py), for the "openlineage" sink only.
    LINEAGE = "openlineage.run_event"
    #: Alerts of the other rule kinds (domain/alerts.py): "alert.<kind>".
    NEEDS_INSPECTION = "alert.needs_inspection"
    QUALITY_GATE_FAILED = "alert.quality_gate_failed"
    CONSECUTIVE_FAILURES = "alert.consecutive_failures"
    RUN_OVER_BUDGET = "alert.run_over_budget"
    REPEATED_RETRIES = "alert.repeated_retries"
    SENSOR_TIMEOUT = "alert.sensor_timeout"
    BACKFILL_OVER_BUDGET = "alert.backfill_over_budget"

    @property
    def is_alert(self) -> bool:
        """True for the kinds alert rules raise."""
        return (
            self is OutboxKind.TASK_DEAD_LETTER
            or self is OutboxKind.FRESHNESS_MISS
            or self.value.startswith("alert.")
        )


#: Sinks that take alerts only (a Slack webhook has no use for dataset events).
ALERT_ONLY_SINKS = frozenset({"slack"})


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxEntry:
    """One side effect waiting for (or done with) delivery."""

    id: int
    kind: str
    sink: str
    payload: dict[str, Any]  # Any: JSON
    state: str
    attempts: int
    next_attempt_at: datetime
    created_at: datetime
    delivered_at: datetime | None = None
    last_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryPolicy:
    """How hard the relay tries: `max_attempts` in all, waits growing from `base_delay_s` by
    `factor` per failure up to `max_delay_s`, each spread by ±`jitter` (a fraction)."""

    max_attempts: int = 10
    base_delay_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 300.0
    jitter: float = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedDelivery:
    """What follows a failed delivery: dead, or the wait before the next try."""

    dead: bool
    delay_s: float = 0.0


def after_failure(policy: DeliveryPolicy, *, attempts: int, rand: float) -> FailedDelivery:
    """Decide after the `attempts`-th failed delivery (1 for the first); `rand` in [0, 1)."""
    if attempts >= policy.max_attempts:
        return FailedDelivery(dead=True)
    delay = min(policy.base_delay_s * policy.factor ** (attempts - 1), policy.max_delay_s)
    spread = 1 + policy.jitter * (2 * rand - 1)
    return FailedDelivery(dead=False, delay_s=delay * spread)
