"""Admission control: whether new queued work fits the queued-task-instance limits (pure).

A trigger, a backfill or a dataset run is admitted only when the task instances it queues at
once, added to those already queued, stay within the limit of every queue they enter and of
their DAG. Only `queued` instances count: pending ones queue later, as their upstreams end,
and claiming drains the queue; the limits bound the backlog an operator accepts, not the work.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from treadle.domain.trigger_rules import TriggerRule

if TYPE_CHECKING:
    from treadle.domain.dag_version import DagStructure

#: The settings that hold the two limits (named in every refusal).
PER_QUEUE_SETTING = "TREADLE_MAX_QUEUED_PER_QUEUE"
PER_DAG_SETTING = "TREADLE_MAX_QUEUED_PER_DAG"
#: What a refusal asks the client to wait before trying again (HTTP Retry-After), in seconds.
RETRY_AFTER_S = 30


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionLimits:
    """Most queued task instances per queue and per DAG (0: no limit)."""

    per_queue: int = 0
    per_dag: int = 0

    @property
    def is_off(self) -> bool:
        """True when neither limit is set: admission reads nothing."""
        return self.per_queue <= 0 and self.per_dag <= 0


#: No limits: what admission defaults to.
NO_LIMITS = AdmissionLimits()


@dataclass(frozen=True, slots=True, kw_only=True)
class Overload:
    """The limit a piece of work would exceed."""

    #: The setting holding the limit (TREADLE_MAX_QUEUED_PER_QUEUE or ..._PER_DAG).
    setting: str
    limit: int
    #: "queue" or "dag".
    scope: str
    #: The queue's or the DAG's name.
    name: str
    #: Task instances queued there now.
    queued: int
    #: Task instances the refused work would have queued there.
    adding: int

    def describe(self, what: str) -> str:
        """The refusal in words, e.g. "a trigger of DAG 'x' would queue ...", naming the setting."""
        where = f"queue {self.name!r}" if self.scope == "queue" else f"DAG {self.name!r}"
        return (
            f"overloaded: {what} would queue {self.adding} task instance(s) in {where}, which has "
            f"{self.queued} queued already; {self.setting} is {self.limit}. Try again once the "
            "queue drains"
        )


def queued_roots(structure: DagStructure) -> Counter[str]:
    """How many task instances one new run of the DAG queues at once, per queue.

    Roots, and tasks whose trigger rule is `always`, are queued when the run is created (as
    engine/runs.py builds them); a mapped root counts once, as it is created.
    """
    return Counter(
        t.queue
        for t in structure.tasks.values()
        if not t.upstream or t.trigger_rule == TriggerRule.ALWAYS.value
    )


def find_overload(
    limits: AdmissionLimits,
    *,
    dag_id: str,
    adding: Mapping[str, int],
    queued_by_queue: Mapping[str, int],
    queued_in_dag: int,
) -> Overload | None:
    """The first limit that `adding` (queue -> instances) would exceed, or None: admitted.

    Queues are checked in name order, then the DAG, so the same state gives the same answer.
    """
    if limits.per_queue > 0:
        for queue in sorted(adding):
            queued, more = queued_by_queue.get(queue, 0), adding[queue]
            if more > 0 and queued + more > limits.per_queue:
                return Overload(
                    setting=PER_QUEUE_SETTING,
                    limit=limits.per_queue,
                    scope="queue",
                    name=queue,
                    queued=queued,
                    adding=more,
                )
    total = sum(adding.values())
    if limits.per_dag > 0 and total > 0 and queued_in_dag + total > limits.per_dag:
        return Overload(
            setting=PER_DAG_SETTING,
            limit=limits.per_dag,
            scope="dag",
            name=dag_id,
            queued=queued_in_dag,
            adding=total,
        )
    return None
