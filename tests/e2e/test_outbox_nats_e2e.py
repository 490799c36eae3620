"""NATS end to end: a real scheduler and worker with TREADLE_OUTBOX_NATS_URL set; a subscriber
on the machine's NATS server receives the dataset event of a real run, and the alert of its
failed task, on their subjects."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.nats import URL, Subscriber, require_server, unique_prefix
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DAG = """
    from treadle import Alert, Dataset, dag, task


    @task(outlets=[Dataset("warehouse.shipments")])
    def load() -> int:
        return 1


    @task(retries=0)
    def check() -> None:
        raise ValueError("shipments do not balance")


    @dag(dag_id="shipments", owner="logistics", failure_impact="trucks leave half empty",
         alerts=[Alert("dead_letter", severity="critical")])
    def shipments() -> None:
        load()
        check()


    shipments()
"""


def test_a_subscriber_receives_the_dataset_event_and_the_alert_of_a_real_run(
    tmp_path: Path, cluster: Callable[..., Cluster]
) -> None:
    require_server()
    prefix = unique_prefix()
    subscriber = Subscriber(f"{prefix}.>")
    try:
        c = cluster(
            f"sqlite:///{tmp_path / 'nats.db'}",
            TREADLE_OUTBOX_NATS_URL=URL,
            TREADLE_OUTBOX_NATS_SUBJECT_PREFIX=prefix,
            TREADLE_UI_BASE_URL="https://treadle.example",
        )
        c.write_dag("shipments.py", DAG)
        assert c.cli("db", "upgrade").returncode == 0
        c.start("scheduler", "scheduler")
        c.worker("worker")
        c.wait_dag("shipments")
        run_id = c.trigger("shipments")
        c.wait_run(run_id)
        wait_for(
            lambda: len(subscriber.messages) >= 2, timeout=60, message="the event and the alert received"
        )
        by_subject = {subject: json.loads(body) for subject, _, body in subscriber.messages}
        event = by_subject[f"{prefix}.dataset.warehouse.shipments"]
        assert event["kind"] == "dataset.published" and event["payload"]["run_id"] == run_id
        alert = by_subject[f"{prefix}.alert.dead_letter.shipments"]["payload"]
        assert (alert["severity"], alert["task_id"], alert["run_id"]) == ("critical", "check", run_id)
        assert alert["impact"] == "trucks leave half empty" and alert["owner"] == "logistics"
        assert alert["ui_url"] == f"https://treadle.example/runs/{run_id}/tasks/check"
        wait_for(
            lambda: len(c.cli_json("outbox", "list", "--state", "delivered")) == 2,
            timeout=30,
            message="both entries settled as delivered",
        )
    finally:
        subscriber.close()
