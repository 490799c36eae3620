"""OpenLineage: START, COMPLETE, FAIL and ABORT of runs and task attempts, written to the outbox
with their state change and delivered in order, with the right datasets, through the
openlineage-python event model to a real local HTTP receiver and to a JSON-lines file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openlineage.client.facet_v2 import parent_run

from tests.helpers.webhook import Receiver
from treadle import Dataset, dag, task
from treadle.config import Settings
from treadle.delivery.lineage import OpenLineageSink, to_run_event
from treadle.delivery.relay import OutboxRelay, Routes
from treadle.domain.lineage import attempt_uuid, run_uuid
from treadle.domain.outbox import DeliveryPolicy, OutboxKind, OutboxState
from treadle.engine import lineage, outbox
from treadle.engine.cancellation import cancel_run
from treadle.engine.leadership import Leadership
from treadle.errors import ConfigError
from treadle.testing import DagRunner

NAMESPACE = "test-lineage"
RAW = Dataset("lake.raw_orders")
STAGED = Dataset("lake.staged_orders")
SALES = Dataset("warehouse.sales")


@task(outlets=[STAGED])
def extract() -> int:
    return 1


@task(outlets=[SALES])
def load(n: int) -> int:
    return n


@dag(dag_id="orders", inlets=[RAW])
def orders() -> None:
    load(extract())


@task(retries=0)
def broken() -> None:
    raise RuntimeError("the source is gone")


@dag(dag_id="broken_orders")
def broken_orders() -> None:
    broken()


def _runner(dag_: Any, db_url: str, *, namespace: str | None = NAMESPACE) -> DagRunner:  # Any: a Dag
    runner = DagRunner(dag_, database_url=db_url)
    runner.db.lineage_namespace = namespace
    return runner


_LEADERS: dict[int, Leadership] = {}


def _deliver(runner: DagRunner, sink: OpenLineageSink) -> None:
    """One relay round as the leader (the same leadership for every round on this database)."""
    leader = _LEADERS.setdefault(id(runner.db), Leadership(runner.db, holder="s1", lease_s=30))
    assert leader.refresh()
    relay = OutboxRelay(
        runner.db,
        leader,
        Routes({lineage.SINK: sink}),
        policy=DeliveryPolicy(max_attempts=3, base_delay_s=0.05),
        ack_s=5,
        ordered=lambda entry: entry.sink == lineage.SINK,
    )
    try:
        relay.round()
    finally:
        relay.pool.shutdown()
        relay.database.shutdown()
        relay.sink.close()


def _check_run(events: list[dict[str, Any]], run_id: str) -> None:
    """The events of one successful `orders` run: in order, with their datasets."""
    kinds = [(e["job"]["name"], e["eventType"]) for e in events]
    assert kinds == [
        ("orders", "START"),
        ("orders.extract", "START"),
        ("orders.extract", "COMPLETE"),
        ("orders.load", "START"),
        ("orders.load", "COMPLETE"),
        ("orders", "COMPLETE"),
    ]
    assert all(e["job"]["namespace"] == NAMESPACE for e in events)
    run, extract_, load_ = events[0], events[1], events[3]
    assert run["run"]["runId"] == events[-1]["run"]["runId"] == run_uuid(run_id)
    assert [(d["namespace"], d["name"]) for d in run["inputs"]] == [(NAMESPACE, RAW.name)]
    assert sorted(d["name"] for d in run["outputs"]) == [STAGED.name, SALES.name]
    # The root task reads the DAG's inputs; each task writes its own outlets.
    assert [d["name"] for d in extract_["inputs"]] == [RAW.name]
    assert [d["name"] for d in extract_["outputs"]] == [STAGED.name]
    assert load_["inputs"] == [] and [d["name"] for d in load_["outputs"]] == [SALES.name]
    assert extract_["run"]["runId"] == attempt_uuid(run_id, "extract", -1, 1)
    assert extract_["run"]["facets"]["parent"]["run"]["runId"] == run_uuid(run_id)
    parent_job = extract_["run"]["facets"]["parent"]["job"]
    assert (parent_job["namespace"], parent_job["name"]) == (NAMESPACE, "orders")
    assert all(e["producer"] and e["eventTime"] for e in events)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(status=200, path="/api/v1/lineage")
    yield r
    r.close()


def test_lineage_off_writes_nothing(db_url: str) -> None:
    runner = _runner(orders, db_url, namespace=None)
    try:
        runner.run_until_done(runner.trigger())
        assert outbox.list_entries(runner.db) == []
    finally:
        runner.close()


def test_a_runs_events_reach_an_http_receiver_in_order_with_their_datasets(
    db_url: str, receiver: Receiver
) -> None:
    runner = _runner(orders, db_url)
    try:
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        entries = outbox.list_entries(runner.db)
        assert len(entries) == 6 and {(e.kind, e.sink) for e in entries} == {
            (OutboxKind.LINEAGE.value, lineage.SINK)
        }
        _deliver(runner, OpenLineageSink(url=receiver.url, file=None, ack_s=5))
        _check_run([json.loads(body) for _, body in receiver.received], run_id)
        assert {h["Content-Type"] for h, _ in receiver.received} == {"application/json"}
        assert {e.state for e in outbox.list_entries(runner.db)} == {OutboxState.DELIVERED}
    finally:
        runner.close()


def test_a_failing_receiver_holds_the_rest_back_so_order_survives_a_retry(
    db_url: str, receiver: Receiver
) -> None:
    runner = _runner(orders, db_url)
    try:
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        receiver.status = 503
        _deliver(runner, OpenLineageSink(url=receiver.url, file=None, ack_s=5))
        assert len(receiver.received) == 1  # the first failed; the rest waited behind it
        pending = outbox.list_entries(runner.db, state=OutboxState.PENDING)
        assert len(pending) == 6 and all(e.last_error for e in pending)
        receiver.status = 200
        receiver.received.clear()
        runner.db.transact(
            lambda conn: conn.exec_driver_sql("UPDATE outbox SET next_attempt_at = created_at")
        )
        _deliver(runner, OpenLineageSink(url=receiver.url, file=None, ack_s=5))
        _check_run([json.loads(body) for _, body in receiver.received], run_id)
    finally:
        _LEADERS.pop(id(runner.db), None)
        runner.close()


def test_fail_and_abort_events_go_to_a_file(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "lineage.jsonl"
    runner = _runner(broken_orders, db_url)
    other = _runner(orders, db_url)
    try:
        failed = runner.trigger()
        runner.run_until_done(failed)
        cancelled = other.trigger()
        cancel_run(other.db, cancelled, actor="test")
        _deliver(runner, OpenLineageSink(url=None, file=path, ack_s=5))
        events = [json.loads(line) for line in path.read_text().splitlines()]
        by_run: dict[str, list[tuple[str, str]]] = {}
        for e in events:
            parent = e["run"]["facets"].get("parent")
            key = parent["run"]["runId"] if parent else e["run"]["runId"]
            by_run.setdefault(key, []).append((e["job"]["name"], e["eventType"]))
        assert by_run[run_uuid(failed)] == [
            ("broken_orders", "START"),
            ("broken_orders.broken", "START"),
            ("broken_orders.broken", "FAIL"),
            ("broken_orders", "FAIL"),
        ]
        assert by_run[run_uuid(cancelled)] == [("orders", "START"), ("orders", "ABORT")]
    finally:
        runner.close()
        other.close()


def test_payloads_become_the_clients_run_events() -> None:
    event = to_run_event(
        {
            "eventType": "START",
            "eventTime": "2026-01-01T00:00:00+00:00",
            "namespace": NAMESPACE,
            "job": "orders.extract",
            "runId": attempt_uuid("r1", "extract", -1, 1),
            "parent": {"job": "orders", "runId": run_uuid("r1")},
            "inputs": ["a"],
            "outputs": ["b"],
        }
    )
    assert event.job.name == "orders.extract" and event.inputs[0].name == "a"  # type: ignore[index]
    parent = (event.run.facets or {})["parent"]
    assert isinstance(parent, parent_run.ParentRunFacet) and parent.job.name == "orders"


def test_lineage_settings_are_checked() -> None:
    on = Settings.from_env({"TREADLE_OPENLINEAGE_URL": "http://127.0.0.1:5000/api/v1/lineage"})
    assert on.lineage_namespace == "treadle"
    assert Settings.from_env({}).lineage_namespace is None
    named = Settings.from_env(
        {"TREADLE_OPENLINEAGE_FILE": "/tmp/x.jsonl", "TREADLE_OPENLINEAGE_NAMESPACE": "prod"}
    )
    assert named.lineage_namespace == "prod"
    with pytest.raises(ConfigError, match="TREADLE_OPENLINEAGE_URL"):
        Settings.from_env({"TREADLE_OPENLINEAGE_URL": "ftp://x"})
    with pytest.raises(ConfigError, match="not both"):
        Settings.from_env(
            {"TREADLE_OPENLINEAGE_URL": "http://x/l", "TREADLE_OPENLINEAGE_FILE": "/tmp/x.jsonl"}
        )
    with pytest.raises(ConfigError, match="does not exist"):
        Settings.from_env({"TREADLE_OPENLINEAGE_FILE": "/no/such/folder/x.jsonl"})
