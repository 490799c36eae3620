"""The outbox end to end: a real worker and scheduler with a webhook configured, a receiver that
fails until told otherwise, the entries dead after their last attempt, then replayed and
purged with `treadle outbox`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from tests.helpers.webhook import Receiver
from treadle.delivery.webhook import signature

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DAG = """
    from treadle import Dataset, dag, task


    @task(outlets=[Dataset("warehouse.orders")])
    def load() -> int:
        return 1


    @task(retries=0)
    def check() -> None:
        raise ValueError("orders do not balance")


    @dag(dag_id="shipping")
    def shipping() -> None:
        load()
        check()


    shipping()
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(status=500, path="/treadle")
    yield r
    r.close()


def test_dead_entries_are_listed_replayed_delivered_and_purged(
    tmp_path: Path, cluster: Callable[..., Cluster], receiver: Receiver
) -> None:
    c = cluster(
        f"sqlite:///{tmp_path / 'outbox.db'}",
        TREADLE_OUTBOX_WEBHOOK_URL=receiver.url,
        TREADLE_OUTBOX_WEBHOOK_SECRET="hook-secret",
        TREADLE_OUTBOX_MAX_ATTEMPTS="2",
    )
    c.write_dag("shipping.py", DAG)
    assert c.cli("db", "upgrade").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("worker")
    c.wait_dag("shipping")
    run_id = c.trigger("shipping")
    c.wait_run(run_id)

    def dead() -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = c.cli_json("outbox", "list", "--state", "dead")
        return entries if len(entries) == 2 else []

    entries = wait_for(dead, timeout=60, message="both entries dead after two deliveries")
    assert {e["kind"] for e in entries} == {"dataset.published", "task.dead_letter"}
    assert all(e["attempts"] == 2 and "HTTP 500" in e["last_error"] for e in entries)
    assert len(receiver.received) == 4

    receiver.status = 200
    receiver.received.clear()
    replayed = c.cli("outbox", "replay", "--all-dead")
    assert replayed.returncode == 0 and "replayed 2 dead entries" in replayed.stdout
    wait_for(lambda: len(receiver.received) == 2, timeout=60, message="the replayed entries delivered")
    documents = {json.loads(body)["kind"]: (headers, body) for headers, body in receiver.received}
    headers, body = documents["task.dead_letter"]
    alert = json.loads(body)["payload"]
    assert (alert["dag_id"], alert["task_id"], alert["run_id"]) == ("shipping", "check", run_id)
    assert "orders do not balance" in alert["message"]
    expected = signature("hook-secret", timestamp=headers["X-Treadle-Timestamp"], body=body)
    assert headers["X-Treadle-Signature"] == expected
    assert json.loads(documents["dataset.published"][1])["payload"]["dataset"] == "warehouse.orders"
    wait_for(
        lambda: len(c.cli_json("outbox", "list", "--state", "delivered")) == 2,
        timeout=30,
        message="the deliveries settled",
    )

    assert c.cli("outbox", "replay").returncode != 0  # neither ids nor --all-dead
    wait_for(
        lambda: "purged 2 entries" in c.cli("outbox", "purge", "--older-than", "1s").stdout,
        timeout=30,
        message="the delivered entries purged once a second old",
    )
    assert c.cli_json("outbox", "list") == []
    audit = c.cli_json("audit", "--action", "outbox.replay")
    assert len(audit) == 1
