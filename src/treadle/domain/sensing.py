"""Sensors and submit-then-poll tasks: when the next poke is due and when waiting is over.

A sensor's attempts are short pokes; between them the task instance waits in
`up_for_reschedule`, holding no worker slot. Its timeout counts from the first poke
(`task_instances.first_poke_at`), on the database's clock: a poke that starts at or past the
deadline is the last one. Pure functions; `now` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any


class PokeKind(StrEnum):
    """What a poke runs: a sensor's condition, or a submitted job's submit / poll."""

    SENSOR = "sensor"
    DEFERRED = "deferred"


#: Default sensor timeout (seconds): a week, as long as a daily file may reasonably be late.
DEFAULT_SENSOR_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SensorSpec:
    """How a sensor or a submit-then-poll task waits between pokes."""

    kind: PokeKind = PokeKind.SENSOR
    poke_interval_s: float = 60.0
    #: Seconds from the first poke after which waiting ends (None: never).
    timeout_s: float | None = DEFAULT_SENSOR_TIMEOUT_S
    #: On timeout, end `skipped` instead of dead-lettering with `sensor_timeout`.
    soft_fail: bool = False

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {
            "kind": self.kind.value,
            "poke_interval_s": self.poke_interval_s,
            "timeout_s": self.timeout_s,
            "soft_fail": self.soft_fail,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> SensorSpec:
        """Build from the JSON form."""
        timeout = data.get("timeout_s", DEFAULT_SENSOR_TIMEOUT_S)
        return SensorSpec(
            kind=PokeKind(data.get("kind", PokeKind.SENSOR.value)),
            poke_interval_s=float(data.get("poke_interval_s", 60.0)),
            timeout_s=None if timeout is None else float(timeout),
            soft_fail=bool(data.get("soft_fail", False)),
        )


def poke_deadline(spec: SensorSpec, first_poke_at: datetime | None) -> datetime | None:
    """When waiting ends (None: no timeout, or no poke yet)."""
    if spec.timeout_s is None or first_poke_at is None:
        return None
    return first_poke_at + timedelta(seconds=spec.timeout_s)


def is_final_poke(spec: SensorSpec, *, first_poke_at: datetime | None, now: datetime) -> bool:
    """True if a poke starting at `now` is the last one: a condition still unmet then times out."""
    if spec.timeout_s is None:
        return False
    if first_poke_at is None:
        return spec.timeout_s <= 0
    deadline = poke_deadline(spec, first_poke_at)
    return deadline is not None and now >= deadline


def next_poke_at(spec: SensorSpec, *, first_poke_at: datetime, now: datetime) -> datetime:
    """When the next poke is due after one at `now`: one interval later, but never past the
    deadline, so the final poke happens on time."""
    due = now + timedelta(seconds=spec.poke_interval_s)
    deadline = poke_deadline(spec, first_poke_at)
    return due if deadline is None else max(min(due, deadline), now)
