"""The scheduler loop: each tick applies the deadlines the database holds. No user code here."""

from __future__ import annotations

import logging
import random
import threading

from treadle.engine.reaper import promote_due_retries, reap_expired_leases
from treadle.engine.runs import finish_idle_runs
from treadle.store.database import Database

log = logging.getLogger("treadle.scheduler")


class Scheduler:
    """Moves due retries to queued, reaps expired leases, closes finished runs."""

    def __init__(self, db: Database, *, tick_s: float) -> None:
        self.db = db
        self.tick_s = tick_s
        self.stopping = threading.Event()
        self.ticks = 0

    def tick(self) -> dict[str, int]:
        """Run one pass; returns what it changed."""
        changes = {
            "retries_queued": promote_due_retries(self.db),
            "leases_reaped": reap_expired_leases(self.db),
            "runs_finished": finish_idle_runs(self.db),
        }
        self.ticks += 1
        return changes

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
