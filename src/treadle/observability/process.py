"""Metrics and probes of a scheduler, worker or standalone process, wired in one call.

`instrument` adds the process's scrape-time gauges (worker load, leadership) to its metrics,
times its database calls and, when TREADLE_METRICS_PORT is set, serves /metrics, /healthz and
/readyz on that port.
"""

from __future__ import annotations

from collections.abc import Iterable

from treadle.config import Settings
from treadle.observability.health import ProcessCheck, database_check, scheduler_check, worker_checks
from treadle.observability.metrics import DatabaseGauges, GaugeReader, Metrics
from treadle.observability.server import ProcessServer
from treadle.scheduler.loop import Scheduler
from treadle.store.database import Database
from treadle.worker.worker import Worker


def worker_gauges(worker: Worker) -> GaugeReader:
    """Slots, running and buffered attempts of `worker`, read at scrape time."""

    def read() -> Iterable[tuple[str, str, float]]:
        active, prefetched = worker.load
        return (
            (
                "treadle_worker_slots",
                "Attempts this worker runs at once (--concurrency).",
                worker.concurrency,
            ),
            ("treadle_worker_active", "Attempts running in this worker's slots.", active),
            ("treadle_worker_prefetched", "Attempts claimed ahead, waiting in the buffer.", prefetched),
            (
                "treadle_worker_prefetch_limit",
                "Most attempts this worker buffers (--prefetch).",
                worker.prefetch,
            ),
        )

    return GaugeReader(read)


def scheduler_gauges(scheduler: Scheduler) -> GaugeReader:
    """Whether `scheduler` leads, and at which epoch, read at scrape time."""

    def read() -> Iterable[tuple[str, str, float]]:
        leadership = scheduler.leadership
        leading = leadership.is_leader()
        return (
            ("treadle_scheduler_leader", "1 while this scheduler leads.", int(leading)),
            (
                "treadle_scheduler_epoch",
                "Epoch this scheduler leads at (0 while standing by).",
                (leadership.epoch or 0) if leading else 0,
            ),
        )

    return GaugeReader(read)


def instrument(
    settings: Settings,
    db: Database,
    metrics: Metrics,
    *,
    worker: Worker | None = None,
    scheduler: Scheduler | None = None,
    database_gauges: bool = True,
) -> ProcessServer | None:
    """Add the process's gauges to `metrics` and time `db`; serve the metrics port if one is set
    (started here). `database_gauges`: add queue and lease gauges too (False where an API in the
    same process already does). Returns the server to stop, or None."""
    metrics.time_database(db)
    checks: list[ProcessCheck] = [database_check(db)]
    if worker is not None:
        metrics.watch(worker_gauges(worker))
        checks.extend(worker_checks(worker))
    if scheduler is not None:
        metrics.watch(scheduler_gauges(scheduler))
        checks.append(scheduler_check(scheduler))
        if database_gauges:
            metrics.watch(DatabaseGauges(db, worker_stale_s=settings.lease_s))
    if settings.metrics_port is None:
        return None
    server = ProcessServer(metrics, checks, host=settings.metrics_host, port=settings.metrics_port)
    server.start()
    return server
