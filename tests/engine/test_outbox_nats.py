"""The NATS sink against the machine's NATS server: dataset events and alerts on their subjects
(core NATS acknowledged by a flush, JetStream by its PubAck, a redelivery dropped by the
stream on its message id); while the server is unreachable entries are retried, then dead,
then replayed and delivered."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.nats import URL, Subscriber, closed_port, require_server, unique_prefix
from tests.helpers.wait import wait_for
from treadle import Dataset, dag, task
from treadle.config import Settings
from treadle.delivery import nats as nats_sink
from treadle.delivery.relay import OutboxRelay, Routes
from treadle.domain.outbox import DeliveryPolicy, OutboxState
from treadle.engine import outbox
from treadle.engine.leadership import Leadership
from treadle.errors import ConfigError
from treadle.testing import DagRunner

ORDERS = Dataset("warehouse.orders")


@task(outlets=[ORDERS])
def publish_orders() -> int:
    return 1


@task(retries=0)
def reconcile() -> None:
    raise ValueError("orders do not balance")


@dag(dag_id="orders_nats", owner="orders-team")
def orders_nats() -> None:
    publish_orders()
    reconcile()


@pytest.fixture
def runner(db_url: str) -> Iterator[DagRunner]:
    require_server()
    r = DagRunner(orders_nats, database_url=db_url)
    r.db.outbox_sinks = (nats_sink.SINK,)
    yield r
    r.close()


def _relay(
    runner: DagRunner, sink: nats_sink.NatsSink, *, max_attempts: int = 3, leader: Leadership | None = None
) -> OutboxRelay:
    leader = leader or Leadership(runner.db, holder="nats-test", lease_s=30)
    assert leader.refresh()
    policy = DeliveryPolicy(max_attempts=max_attempts, base_delay_s=0.05, max_delay_s=0.05)
    return OutboxRelay(runner.db, leader, Routes({nats_sink.SINK: sink}), policy=policy, ack_s=2)


def _stop(relay: OutboxRelay) -> None:
    relay.pool.shutdown()
    relay.database.shutdown()
    relay.sink.close()


def test_dataset_events_and_alerts_arrive_on_their_subjects(runner: DagRunner) -> None:
    prefix = unique_prefix()
    subscriber = Subscriber(f"{prefix}.>")
    relay = _relay(runner, nats_sink.NatsSink(URL, prefix=prefix, jetstream=False, ack_s=2))
    try:
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        relay.round()
        assert {e.state for e in outbox.list_entries(runner.db)} == {OutboxState.DELIVERED}
        wait_for(lambda: len(subscriber.messages) == 2, timeout=30, message="both messages received")
        by_subject = {subject: (headers, json.loads(body)) for subject, headers, body in subscriber.messages}
        headers, event = by_subject[f"{prefix}.dataset.warehouse.orders"]
        assert event["kind"] == "dataset.published" and event["payload"]["run_id"] == run_id
        assert headers["Nats-Msg-Id"] == f"treadle-{event['id']}"
        assert headers["Treadle-Event"] == "dataset.published"
        _, alert = by_subject[f"{prefix}.alert.dead_letter.orders_nats"]
        assert alert["payload"]["task_id"] == "reconcile" and alert["payload"]["owner"] == "orders-team"
    finally:
        _stop(relay)
        subscriber.close()


def test_jetstream_acknowledges_with_a_puback_and_drops_a_redelivery(runner: DagRunner) -> None:
    prefix = unique_prefix()
    stream = prefix.replace(".", "_")
    subscriber = Subscriber(f"{prefix}.>")

    async def add_stream(client: Any) -> None:
        await client.jetstream().add_stream(name=stream, subjects=[f"{prefix}.>"])

    async def count(client: Any) -> int:
        info = await client.jetstream().stream_info(stream)
        return int(info.state.messages)

    async def drop_stream(client: Any) -> None:
        await client.jetstream().delete_stream(stream)

    subscriber.run(add_stream)
    sink = nats_sink.NatsSink(URL, prefix=prefix, jetstream=True, ack_s=2)
    relay = _relay(runner, sink)
    try:
        runner.run_until_done(runner.trigger())
        relay.round()
        assert {e.state for e in outbox.list_entries(runner.db)} == {OutboxState.DELIVERED}
        assert subscriber.run(count) == 2
        # At least once: a relay that delivers an entry again (its settle was lost) is harmless.
        assert sink.deliver(outbox.list_entries(runner.db)[0]) is None
        assert subscriber.run(count) == 2
    finally:
        _stop(relay)
        subscriber.run(drop_stream)
        subscriber.close()


def test_while_nats_is_unreachable_entries_are_retried_then_dead_and_replayable(runner: DagRunner) -> None:
    prefix = unique_prefix()
    down = _relay(
        runner,
        nats_sink.NatsSink(f"nats://127.0.0.1:{closed_port()}", prefix=prefix, jetstream=False, ack_s=0.5),
        max_attempts=2,
    )
    try:
        runner.run_until_done(runner.trigger())
        down.round()
        waiting = outbox.list_entries(runner.db, state=OutboxState.PENDING)
        assert len(waiting) == 2 and all(e.attempts == 1 and "NATS" in (e.last_error or "") for e in waiting)
        wait_for(
            lambda: (
                down.round() in (True, False)
                and not outbox.list_entries(runner.db, state=OutboxState.PENDING)
            ),
            timeout=60,
            message="both entries dead after two attempts",
        )
        dead = outbox.list_entries(runner.db, state=OutboxState.DEAD)
        assert len(dead) == 2 and {e.attempts for e in dead} == {2}
    finally:
        _stop(down)
    subscriber = Subscriber(f"{prefix}.>")
    up = _relay(
        runner, nats_sink.NatsSink(URL, prefix=prefix, jetstream=False, ack_s=2), leader=down.leadership
    )
    try:
        assert outbox.replay(runner.db, ids=None, actor="test") == 2
        up.round()
        wait_for(lambda: len(subscriber.messages) == 2, timeout=30, message="the replayed entries received")
        assert sorted(json.loads(body)["id"] for _, _, body in subscriber.messages) == sorted(
            e.id for e in dead
        )
        assert {e.state for e in outbox.list_entries(runner.db)} == {OutboxState.DELIVERED}
    finally:
        _stop(up)
        subscriber.close()


def test_the_nats_setting_without_the_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"TREADLE_OUTBOX_NATS_URL": URL, "TREADLE_OUTBOX_NATS_SUBJECT_PREFIX": "prod.treadle"}
    settings = Settings.from_env(env)
    assert settings.outbox_sinks == ("nats",) and settings.outbox_nats_subject_prefix == "prod.treadle"
    with pytest.raises(ConfigError, match="TREADLE_OUTBOX_NATS_SUBJECT_PREFIX"):
        Settings.from_env({**env, "TREADLE_OUTBOX_NATS_SUBJECT_PREFIX": "bad.>"})
    with pytest.raises(ConfigError, match="nats://"):
        Settings.from_env({"TREADLE_OUTBOX_NATS_URL": "http://127.0.0.1:4222"})
    monkeypatch.setitem(sys.modules, "nats", None)  # what an environment without nats-py imports
    with pytest.raises(ConfigError, match=r"treadle\[nats\]"):
        nats_sink.require_client()
    with pytest.raises(ConfigError, match=r"TREADLE_OUTBOX_NATS_URL.*treadle\[nats\]"):
        Settings.from_env(env)
