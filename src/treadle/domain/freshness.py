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
from datetime import datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """One output of a DAG with a freshness SLO, as the leader reads it."""

    dag_id: str
    dataset: str
    slo_s: float
    last_event_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Miss:
    """An output older than its SLO (or never published)."""

    dag_id: str
    dataset: str
    slo_s: float
    #: Seconds since the newest event.
    age_s: float
    period: str

    @property
    def key(self) -> str:
        """The identity of this miss: alerted once."""
        text = "\0".join((self.dag_id, self.dataset, self.period))
        return hashlib.sha256(text.encode()).hexdigest()


def misses(outputs: list[Output], *, now: datetime) -> list[Miss]:
    """The outputs that miss their SLO at `now`, in the order given."""
    found = []
    for o in outputs:
        if o.last_event_at is None:
            continue
        age = (now - o.last_event_at).total_seconds()
        if age > o.slo_s:
            period = o.last_event_at.isoformat()
            found.append(Miss(dag_id=o.dag_id, dataset=o.dataset, slo_s=o.slo_s, age_s=age, period=period))
    return found
