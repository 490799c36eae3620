"""What the worker and scheduler tell observers: one call per event, no-ops by default.

The loops call these; `observability/metrics.py` turns them into Prometheus series. Nothing here
imports prometheus_client, so a process without metrics pays one empty method call per event.
"""

from __future__ import annotations


class Hooks:
    """Observer of a worker's or scheduler's events. Every method is a no-op here; subclasses
    override what they record. Calls come from several threads and must not block or raise."""

    def attempt_finished(self, *, dag_id: str, task_id: str, outcome: str, duration_s: float) -> None:
        """A task process reported how an attempt ended (`outcome` is an AttemptOutcome value)."""

    def attempt_started(self, *, dag_id: str, delay_s: float) -> None:
        """An attempt started `delay_s` after its task instance became ready (database times)."""

    def attempt_retried(self, *, dag_id: str, task_id: str) -> None:
        """A failed attempt was recorded and its task instance waits for a retry."""

    def attempt_dead_lettered(self, *, dag_id: str, task_id: str) -> None:
        """A failed attempt was recorded and its task instance became a dead letter."""

    def attempt_needs_inspection(self, *, dag_id: str, task_id: str) -> None:
        """An attempt ended with an unknown commit and waits for an operator."""

    def admission_refused(self, *, reason: str, count: int) -> None:
        """A claim left `count` queued candidates behind because of `reason` (pool, dag_limit)."""

    def leases_reaped(self, count: int) -> None:
        """The reaper ended `count` attempts whose lease expired (their worker went silent)."""

    def schedule_fired(self, *, delay_s: float) -> None:
        """A scheduled run was created `delay_s` after its slot's fire time."""

    def database_call(self, *, kind: str, duration_s: float) -> None:
        """One `Database.transact` (kind "write") or `Database.query` ("read"), retries included."""


#: The observer of a process that records nothing.
NO_HOOKS = Hooks()
