"""Prometheus metrics of one treadle process: hook counters, process gauges and database gauges.

Each process builds one `Metrics` (its own registry: no global state) and hands it to its loops as
their `Hooks`. Counters and histograms move in the hot path, so they are plain prometheus_client
calls on pre-declared families; gauges that need the database are read at scrape time.
Labels are bounded: DAG and task ids, outcomes, queues, reasons; never run ids or attempts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from treadle.engine.scheduling import LEADER_LEASE
from treadle.observability.hooks import Hooks
from treadle.store.database import Database
from treadle.store.gauges import SystemGauges, read_gauges

#: Content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)
_DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
_DB_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class Metrics(Hooks):
    """The Prometheus side of the hooks, plus the collectors a process adds (`watch_*`)."""

    def __init__(self) -> None:
        # The text format's `_created` series double every counter and histogram for nothing a
        # Prometheus server uses; the switch is the library's, for the whole process.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        task = ["dag_id", "task_id"]
        self.outcomes = Counter(
            "treadle_task_outcomes", "Attempts ended, by how (as the task process reported).",
            [*task, "outcome"], registry=r,
        )  # fmt: skip
        # Per DAG, not per task: a histogram is ~16 series per label set, and a DAG of 2,000 tasks
        # would make every scrape a 30,000-line, one-second affair. Per-task durations are on
        # the attempt rows (`treadle runs show`, task_attempts.duration_s).
        self.durations = Histogram(
            "treadle_task_duration_seconds", "Run time of attempts in their task process.",
            ["dag_id"], buckets=_DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.start_delays = Histogram(
            "treadle_task_start_delay_seconds", "From ready (queued) to started, database times.",
            ["dag_id"], buckets=_DELAY_BUCKETS, registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "treadle_task_retries", "Failed attempts that wait for a retry.", task, registry=r
        )
        self.dead_letters = Counter(
            "treadle_dead_letters", "Task instances that became dead letters.", task, registry=r
        )
        self.inspections = Counter(
            "treadle_needs_inspection", "Attempts that ended with an unknown commit.", task, registry=r
        )
        self.refusals = Counter(
            "treadle_admission_refusals", "Ready task instances a claim left queued: a pool or "
            "DAG limit was full.", ["reason"], registry=r,
        )  # fmt: skip
        self.lost_leases = Counter(
            "treadle_lost_leases", "Attempts the reaper ended because their lease expired.", registry=r
        )
        self.fire_delays = Histogram(
            "treadle_cron_fire_delay_seconds", "From a schedule slot's fire time to its run's creation.",
            buckets=_DELAY_BUCKETS, registry=r,
        )  # fmt: skip
        self.db_calls = Histogram(
            "treadle_database_call_seconds", "Database transactions (write) and queries (read), retries "
            "included.", ["kind"], buckets=_DB_BUCKETS, registry=r,
        )  # fmt: skip
        # Label children looked up once: `labels()` validates and locks on every call, and these
        # move for every attempt. Bounded like the labels themselves (DAGs, tasks, outcomes).
        self._per_outcome: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}
        self._per_dag: dict[str, Histogram] = {}
        self._per_kind: dict[str, Histogram] = {}

    def attempt_finished(self, *, dag_id: str, task_id: str, outcome: str, duration_s: float) -> None:
        """Count the outcome and observe the duration."""
        key = (dag_id, task_id, outcome)
        children = self._per_outcome.get(key)
        if children is None:
            children = (self.outcomes.labels(*key), self.durations.labels(dag_id))
            self._per_outcome[key] = children
        children[0].inc()
        children[1].observe(duration_s)

    def attempt_started(self, *, dag_id: str, delay_s: float) -> None:
        """Observe the ready-to-started delay."""
        child = self._per_dag.get(dag_id)
        if child is None:
            child = self._per_dag[dag_id] = self.start_delays.labels(dag_id)
        child.observe(max(delay_s, 0.0))

    def attempt_retried(self, *, dag_id: str, task_id: str) -> None:
        """Count a retry."""
        self.retries.labels(dag_id, task_id).inc()

    def attempt_dead_lettered(self, *, dag_id: str, task_id: str) -> None:
        """Count a dead letter."""
        self.dead_letters.labels(dag_id, task_id).inc()

    def attempt_needs_inspection(self, *, dag_id: str, task_id: str) -> None:
        """Count an attempt left for an operator."""
        self.inspections.labels(dag_id, task_id).inc()

    def admission_refused(self, *, reason: str, count: int) -> None:
        """Count refused candidates."""
        self.refusals.labels(reason).inc(count)

    def leases_reaped(self, count: int) -> None:
        """Count lost leases."""
        self.lost_leases.inc(count)

    def schedule_fired(self, *, delay_s: float) -> None:
        """Observe a fire delay."""
        self.fire_delays.observe(delay_s)

    def database_call(self, *, kind: str, duration_s: float) -> None:
        """Observe one database call."""
        child = self._per_kind.get(kind)
        if child is None:
            child = self._per_kind[kind] = self.db_calls.labels(kind)
        child.observe(duration_s)

    def time_database(self, db: Database) -> None:
        """Time every call `db` makes from now on (`treadle_database_call_seconds`)."""
        db.on_call = lambda kind, duration_s: self.database_call(kind=kind, duration_s=duration_s)

    def watch(self, collector: Collector) -> None:
        """Add a scrape-time collector (worker load, leadership, database gauges)."""
        self.registry.register(collector)

    def exposition(self) -> bytes:
        """Every series in the Prometheus text format."""
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class GaugeReader(Collector):
    """Gauges read from a callable at scrape time: (name, help, value) triples."""

    read: Callable[[], Iterable[tuple[str, str, float]]]

    def collect(self) -> Iterator[Metric]:
        """One gauge family per triple."""
        for name, text, value in self.read():
            yield GaugeMetricFamily(name, text, value=value)


@dataclass(frozen=True, slots=True)
class DatabaseGauges(Collector):
    """Queue depth and oldest age per queue, the leader lease, worker heartbeats: one short read
    transaction per scrape. `worker_stale_s`: a running worker silent longer than this is silent."""

    db: Database
    worker_stale_s: float

    def describe(self) -> Iterator[Metric]:
        """Nothing up front: describing must not reach the database."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """Read the gauges; a database that does not answer yields `treadle_database_up 0` only."""
        up = GaugeMetricFamily("treadle_database_up", "1 when the scrape could read the database.")
        try:
            gauges = self.db.query(lambda conn: read_gauges(conn, lease_name=LEADER_LEASE), attempts=1)
        except Exception:  # a scrape reports the outage instead of failing
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from system_families(gauges, worker_stale_s=self.worker_stale_s)


def system_families(g: SystemGauges, *, worker_stale_s: float) -> Iterator[Metric]:
    """The database gauges as metric families."""
    depth = GaugeMetricFamily("treadle_queue_depth", "Task instances queued, per queue.", labels=["queue"])
    running = GaugeMetricFamily(
        "treadle_queue_running", "Task instances running, per queue.", labels=["queue"]
    )
    age = GaugeMetricFamily(
        "treadle_queue_oldest_age_seconds",
        "Age of the oldest queued task instance (0: none).",
        labels=["queue"],
    )
    for q in g.queues:
        depth.add_metric([q.queue], q.queued)
        running.add_metric([q.queue], q.running)
        oldest = (g.now - q.oldest_queued_at).total_seconds() if q.oldest_queued_at and q.queued else 0.0
        age.add_metric([q.queue], max(oldest, 0.0))
    yield from (depth, running, age)
    lease = g.leader
    expires = lease.expires_at if lease is not None and lease.holder is not None else None
    present = expires is not None and expires > g.now
    yield GaugeMetricFamily(
        "treadle_leader_present", "1 while a scheduler holds an unexpired leader lease.", value=int(present)
    )
    yield GaugeMetricFamily(
        "treadle_leader_epoch", "Epoch of the leader lease (bumped at every change of holder).",
        value=lease.epoch if lease is not None else 0,
    )  # fmt: skip
    ages = [(g.now - w.last_heartbeat_at).total_seconds() for w in g.running_workers]
    workers = GaugeMetricFamily(
        "treadle_workers", "Workers in state running, live (heartbeat within the lease) or silent.",
        labels=["status"],
    )  # fmt: skip
    workers.add_metric(["live"], sum(1 for a in ages if a <= worker_stale_s))
    workers.add_metric(["silent"], sum(1 for a in ages if a > worker_stale_s))
    yield workers
    box = g.outbox
    oldest = (g.now - box.oldest_pending_at).total_seconds() if box.oldest_pending_at else 0.0
    yield GaugeMetricFamily(
        "treadle_outbox_pending", "Outbox entries waiting for delivery.", value=box.pending
    )
    yield GaugeMetricFamily(
        "treadle_outbox_oldest_pending_age_seconds", "Age of the oldest undelivered outbox entry (0: none).",
        value=max(oldest, 0.0),
    )  # fmt: skip
    yield GaugeMetricFamily(
        "treadle_outbox_dead", "Outbox entries dead after their last delivery.", value=box.dead
    )
