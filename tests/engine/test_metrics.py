"""Metrics read from a real database: queue depth and age, the leader lease, worker heartbeats,
admission refusals, start delays, and the timing of database calls."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from treadle import dag, task
from treadle.engine.execution import work_cycle
from treadle.engine.leadership import Leadership
from treadle.engine.pools import set_pool
from treadle.engine.workers import record_worker
from treadle.observability.metrics import DatabaseGauges, Metrics
from treadle.testing import DagRunner


@task(pool="narrow")
def pooled(n: int) -> int:
    return n


@task(queue="etl")
def loader(n: int) -> int:
    return n


@dag(dag_id="gauged")
def gauged() -> None:
    for n in range(3):
        pooled(n)
    for n in range(4):
        loader(n)


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, parsed back, by (name, sorted labels)."""
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_database_gauges_and_hooks_follow_the_queue(db_url: str) -> None:
    runner = DagRunner(gauged, database_url=db_url)
    try:
        db = runner.db
        metrics = Metrics()
        metrics.time_database(db)
        metrics.watch(DatabaseGauges(db, worker_stale_s=30))
        set_pool(db, "narrow", slots=1, description=None, actor="test")
        before = scrape(metrics)
        assert before[("treadle_database_up", ())] == 1
        assert before[("treadle_leader_present", ())] == 0
        assert ("treadle_queue_depth", (("queue", "etl"),)) not in before

        runner.trigger()
        queued = scrape(metrics)
        assert queued[("treadle_queue_depth", (("queue", "etl"),))] == 4
        assert queued[("treadle_queue_depth", (("queue", "default"),))] == 3
        assert queued[("treadle_queue_oldest_age_seconds", (("queue", "etl"),))] >= 0

        record_worker(db, worker_id="w1", hostname="h", pid=1, queues=["default"], concurrency=4, prefetch=0)
        assert Leadership(db, holder="s1", lease_s=30).refresh()
        cycle = work_cycle(
            db,
            successes=[],
            start=[],
            claim_limit=3,
            claim_start=3,
            worker_id="w1",
            hostname="h",
            queues=["default"],
            lease_s=60,
        )
        # One slot in the pool: the other two candidates were refused by admission.
        assert len(cycle.claimed) == 1 and cycle.refused == {"pool": 2}
        metrics.admission_refused(reason="pool", count=cycle.refused["pool"])
        claimed = cycle.claimed[0]
        assert claimed.queued_at is not None and claimed.started_at is not None
        metrics.attempt_started(
            dag_id=claimed.dag_id, delay_s=(claimed.started_at - claimed.queued_at).total_seconds()
        )

        after = scrape(metrics)
        assert after[("treadle_queue_depth", (("queue", "default"),))] == 2
        assert after[("treadle_queue_running", (("queue", "default"),))] == 1
        assert after[("treadle_admission_refusals_total", (("reason", "pool"),))] == 2
        assert after[("treadle_task_start_delay_seconds_count", (("dag_id", "gauged"),))] == 1
        assert after[("treadle_leader_present", ())] == 1
        assert after[("treadle_leader_epoch", ())] >= 1
        assert after[("treadle_workers", (("status", "live"),))] == 1
        assert after[("treadle_workers", (("status", "silent"),))] == 0
        writes = after[("treadle_database_call_seconds_count", (("kind", "write"),))]
        assert writes > before.get(("treadle_database_call_seconds_count", (("kind", "write"),)), 0)
        # Bounded labels: no run id and no attempt number anywhere in the exposition.
        assert not any(k == "run_id" or k == "attempt" for _, labels in after for k, _v in labels)
    finally:
        runner.close()
