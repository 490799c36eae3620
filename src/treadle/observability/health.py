"""Readiness of scheduler and worker processes: each check named, with what it saw.

A process is ready when its database answers and its own role works: a worker has loaded its DAG
folder and serves at least one queue; a scheduler leads, or stands by with a fresh view of the lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from treadle.engine.health import CheckResult
from treadle.errors import TreadleError
from treadle.scheduler.loop import Scheduler
from treadle.store.database import Database, db_now
from treadle.worker.worker import Worker

#: A check of one process: its result, now.
ProcessCheck = Callable[[], CheckResult]


def database_check(db: Database) -> ProcessCheck:
    """The database answers a query within its statement timeout (one try)."""

    def check() -> CheckResult:
        try:
            db.query(db_now, attempts=1)
        except TreadleError as exc:
            return CheckResult(name="database", ok=False, detail=str(exc)[:300])
        return CheckResult(name="database", ok=True, detail="reachable")

    return check


def worker_checks(worker: Worker) -> list[ProcessCheck]:
    """The worker loaded its DAG folder, serves a queue and is not stopping."""

    def dags() -> CheckResult:
        if not worker.dags_loaded:
            return CheckResult(name="dags", ok=False, detail="the DAG folder is not loaded yet")
        return CheckResult(name="dags", ok=True, detail=f"loaded from {worker.settings.dags_folder}")

    def queues() -> CheckResult:
        if worker.stopping.is_set():
            return CheckResult(name="queues", ok=False, detail="stopping: claims no new work")
        if not worker.queues:
            return CheckResult(name="queues", ok=False, detail="serves no queue")
        return CheckResult(name="queues", ok=True, detail="serves " + ", ".join(worker.queues))

    return [dags, queues]


def scheduler_check(scheduler: Scheduler) -> ProcessCheck:
    """The scheduler leads, or stood by with an answer about the lease within one lease."""

    def check() -> CheckResult:
        leadership = scheduler.leadership
        if leadership.is_leader():
            return CheckResult(name="leadership", ok=True, detail=f"leads at epoch {leadership.epoch}")
        seen = leadership.seen_at
        if seen is None:
            return CheckResult(name="leadership", ok=False, detail="has not read the leader lease yet")
        age_s = time.monotonic() - seen
        fresh = age_s <= leadership.lease_s
        detail = f"stands by; read the leader lease {age_s:.1f} s ago (allowed: {leadership.lease_s:g} s)"
        return CheckResult(name="leadership", ok=fresh, detail=detail)

    return check


def run_checks(checks: list[ProcessCheck]) -> list[CheckResult]:
    """Every check's result, in order (each is independent: a down database does not hide the rest)."""
    return [check() for check in checks]
