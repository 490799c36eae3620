"""Datasets end to end: a producer's success triggers exactly one consumer run through a real
worker and scheduler, and `treadle datasets list/events` show what happened."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.domain.records import RunInfo
from treadle.engine import queries
from treadle.store import datasets as dataset_store

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

PRODUCER = """
    from __future__ import annotations

    from treadle import Dataset, TaskContext, dag, task

    SALES = Dataset("warehouse.sales_daily")


    @task(outlets=[SALES])
    def load(context: TaskContext) -> int:
        context.outlet_event(SALES, version="2026-07-04", metadata={"rows": 120})
        return 120


    @dag(dag_id="producer")
    def producer() -> None:
        load()
"""

CONSUMER = """
    from __future__ import annotations

    from treadle import Dataset, TaskContext, dag, task


    @task
    def report(context: TaskContext) -> list[int]:
        return [e["id"] for e in context.manifest["consumed_dataset_events"]]


    @dag(dag_id="consumer", schedule=[Dataset("warehouse.sales_daily")])
    def consumer() -> None:
        report()
"""

NAME = "warehouse.sales_daily"


def _consumer_runs(c: Cluster) -> list[RunInfo]:
    return [r for r in queries.list_runs(c.db, dag_id="consumer", limit=100) if r.run_type == "dataset"]


def test_producer_success_triggers_one_consumer_run_and_cli_shows_it(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url)
    c.write_dag("producer.py", PRODUCER)
    c.write_dag("consumer.py", CONSUMER)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("w1", concurrency=2)
    # The leader's first dataset pass starts the consumer's marks at the current events.
    wait_for(
        lambda: c.db.query(lambda conn: dataset_store.consumer_marks(conn, ["consumer"])),
        timeout=30,
        message="the scheduler to start the consumer's dataset marks",
    )

    produced = c.wait_run(c.trigger("producer"))
    assert produced.run.state == "success"
    [consumer_run] = wait_for(
        lambda: _consumer_runs(c), timeout=30, message="a dataset-triggered consumer run"
    )
    detail = c.wait_run(consumer_run.run_id)
    assert detail.run.state == "success"

    [event] = c.cli_json("datasets", "events", NAME)
    assert event["run_id"] == produced.run.run_id
    assert (event["dag_id"], event["task_id"]) == ("producer", "load")
    assert (event["version"], event["extra"]) == ("2026-07-04", {"rows": 120})
    assert detail.results["report"] == [event["id"]]  # the consumer's task read its manifest
    assert detail.run.manifest is not None
    assert detail.run.manifest["consumed_dataset_events_total"] == 1

    time.sleep(1.5)  # several scheduler ticks: the consumed event triggers nothing more
    assert len(_consumer_runs(c)) == 1

    [listed] = [d for d in c.cli_json("datasets", "list") if d["name"] == NAME]
    assert listed["events"] == 1 and listed["last_event_id"] == event["id"]
    assert listed["producers"] == ["producer.load"]
    assert listed["consumers"] == ["consumer"]

    shown = c.cli("datasets", "list")
    assert shown.returncode == 0 and NAME in shown.stdout and "producer.load" in shown.stdout
    shown = c.cli("datasets", "events", NAME, "--limit", "5")
    assert shown.returncode == 0 and "2026-07-04" in shown.stdout
    unknown = c.cli("datasets", "events", "no.such.dataset")
    assert unknown.returncode == 1 and "no dataset 'no.such.dataset'" in unknown.stderr
