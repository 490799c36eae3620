"""The scheduler loop: each tick applies the deadlines the database holds. No user code here."""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import asdict
from datetime import timedelta

from treadle.engine.reaper import (
    enforce_execution_deadlines,
    expire_dispatch_deadlines,
    promote_due_retries,
    reap_expired_leases,
)
from treadle.engine.retention import PruneReport, prune
from treadle.engine.runs import finish_idle_runs
from treadle.store.database import Database

log = logging.getLogger("treadle.scheduler")

#: Seconds between two retention batches: pruning is housekeeping, not per-tick work.
RETENTION_INTERVAL_S = 60.0


class Scheduler:
    """Moves due retries to queued, reaps expired leases, closes finished runs."""

    def __init__(
        self, db: Database, *, tick_s: float, retention_days: float = 0.0, lease_s: float = 30.0
    ) -> None:
        self.db = db
        self.tick_s = tick_s
        #: A worker silent this long is not live; an unenforced deadline this old is the reaper's.
        self.lease_s = lease_s
        #: Finished history older than this many days is pruned; 0 keeps everything.
        self.retention_days = retention_days
        #: Monotonic time of the next retention batch; 0 makes the first pass prune.
        self.next_prune_at = 0.0
        self.stopping = threading.Event()

    def tick(self) -> dict[str, int]:
        """Run one pass; returns what it changed."""
        changes = {
            "retries_queued": promote_due_retries(self.db),
            "leases_reaped": reap_expired_leases(self.db),
            "deadlines_enforced": enforce_execution_deadlines(self.db, grace_s=self.lease_s),
            "dispatch_timeouts": expire_dispatch_deadlines(self.db, worker_stale_s=self.lease_s),
            "runs_finished": finish_idle_runs(self.db),
        }
        self.prune_step()
        return changes

    def prune_step(self) -> PruneReport | None:
        """Prune one batch of history older than `retention_days` if one is due; None if not."""
        if self.retention_days <= 0 or time.monotonic() < self.next_prune_at:
            return None
        # Set before pruning, so a failing prune is retried once an interval, not every tick.
        self.next_prune_at = time.monotonic() + RETENTION_INTERVAL_S
        report = prune(self.db, older_than=timedelta(days=self.retention_days), max_batches=1)
        if report.deleted_anything:
            log.info(
                "retention pruned",
                extra={
                    "event": "retention.pruned",
                    "cutoff": report.cutoff.isoformat(),
                    **asdict(report.rows),
                },
            )
        return report

    def run(self) -> None:
        """Tick until stopped; database errors back off and retry, never end the loop (F7)."""
        failures = 0
        while not self.stopping.is_set():
            try:
                changes = self.tick()
                failures = 0
                if any(changes.values()):
                    log.info("scheduler tick", extra={"event": "scheduler.tick", **changes})
                delay = self.tick_s
            except Exception:
                failures += 1
                log.exception("scheduler tick failed", extra={"event": "scheduler.tick_error"})
                delay = min(self.tick_s * 2**failures, 30.0) * (0.5 + random.random())
            self.stopping.wait(delay)

    def stop(self) -> None:
        """Stop after the current tick."""
        self.stopping.set()
