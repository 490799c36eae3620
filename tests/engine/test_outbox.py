"""The outbox: effects written in the transaction of their change, delivered by the leader's
relay to a real local webhook receiver, exactly once per success, retried with backoff, dead
after the last attempt, replayed; every relay write fenced by the leader's epoch."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from tests.helpers.wait import wait_for
from tests.helpers.webhook import Receiver
from treadle import Dataset, dag, task
from treadle.delivery.relay import OutboxRelay
from treadle.delivery.webhook import SINK, WebhookSink, signature
from treadle.domain.outbox import DeliveryPolicy, OutboxKind, OutboxState, after_failure
from treadle.engine import outbox
from treadle.engine.leadership import Leadership
from treadle.errors import NotLeader
from treadle.observability.metrics import DatabaseGauges, Metrics
from treadle.testing import DagRunner

SECRET = "s3cret"
SALES = Dataset("warehouse.sales")


@task(outlets=[SALES])
def publish() -> int:
    return 1


@task(retries=0)
def broken() -> None:
    raise RuntimeError("the source is gone")


@dag(dag_id="effects")
def effects() -> None:
    publish()
    broken()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(status=200, path="/hook")
    yield r
    r.close()


def _run(db_url: str, *, sinks: tuple[str, ...]) -> DagRunner:
    runner = DagRunner(effects, database_url=db_url)
    runner.db.outbox_sinks = sinks
    runner.run_until_done(runner.trigger())
    return runner


def test_effects_are_written_with_their_change_and_only_for_configured_sinks(db_url: str) -> None:
    runner = _run(db_url, sinks=())
    try:
        assert outbox.list_entries(runner.db) == []
        runner.db.outbox_sinks = (SINK,)
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        entries = {e.kind: e for e in outbox.list_entries(runner.db)}
        assert set(entries) == {OutboxKind.DATASET_PUBLISHED, OutboxKind.TASK_DEAD_LETTER}
        published = entries[OutboxKind.DATASET_PUBLISHED].payload
        assert (published["dataset"], published["run_id"], published["task_id"]) == (
            SALES.name,
            run_id,
            "publish",
        )
        alert = entries[OutboxKind.TASK_DEAD_LETTER].payload
        assert (alert["task_id"], alert["error_type"], alert["run_id"]) == ("broken", "RuntimeError", run_id)
        assert "the source is gone" in alert["message"] and alert["next_action"]
        assert all(e.state == OutboxState.PENDING and e.sink == SINK for e in entries.values())
    finally:
        runner.close()


def test_the_relay_delivers_once_retries_with_backoff_goes_dead_and_replays(
    db_url: str, receiver: Receiver
) -> None:
    runner = _run(db_url, sinks=(SINK,))
    db = runner.db
    leader = Leadership(db, holder="s1", lease_s=30)
    policy = DeliveryPolicy(max_attempts=2, base_delay_s=0.05, max_delay_s=0.05)
    relay = OutboxRelay(db, leader, WebhookSink(receiver.url, secret=SECRET, ack_s=5), policy=policy, ack_s=5)
    try:
        assert relay.round() is False and receiver.received == []  # not leading: nothing claimed
        assert leader.refresh()
        receiver.status = 503
        relay.round()
        assert len(receiver.received) == 2
        waiting = outbox.list_entries(db, state=OutboxState.PENDING)
        assert {e.attempts for e in waiting} == {1} and all(
            "HTTP 503" in (e.last_error or "") for e in waiting
        )
        wait_for(
            lambda: relay.round() in (True, False) and not outbox.list_entries(db, state=OutboxState.PENDING),
            timeout=30,
        )
        dead = outbox.list_entries(db, state=OutboxState.DEAD)
        assert len(dead) == 2 and {e.attempts for e in dead} == {2}
        gauges = Metrics()
        gauges.watch(DatabaseGauges(db, worker_stale_s=30))
        assert b"treadle_outbox_dead 2.0" in gauges.exposition()

        receiver.status = 200
        receiver.received.clear()
        assert outbox.replay(db, ids=[dead[0].id], actor="test") == 1
        relay.round()
        assert [b["id"] for b in receiver.bodies()] == [dead[0].id]
        assert outbox.replay(db, ids=None, actor="test") == 1
        relay.round()
        relay.round()  # nothing due: delivered entries are never sent again
        assert sorted(b["id"] for b in receiver.bodies()) == sorted(e.id for e in dead)
        assert {e.state for e in outbox.list_entries(db)} == {OutboxState.DELIVERED}
        headers, body = receiver.received[0]
        expected = signature(SECRET, timestamp=headers["X-Treadle-Timestamp"], body=body)
        assert headers["X-Treadle-Signature"] == expected
        assert headers["X-Treadle-Delivery"] == str(receiver.bodies()[0]["id"])
        assert outbox.purge(db, states=[OutboxState.DELIVERED], older_than=timedelta(0), actor="t") == 2
    finally:
        relay.pool.shutdown()
        relay.database.shutdown()
        relay.sink.close()
        runner.close()


ACK_S = 3.0


def test_a_relay_that_lost_the_lease_cannot_settle_and_the_entry_is_claimed_again(db_url: str) -> None:
    runner = _run(db_url, sinks=(SINK,))
    db = runner.db
    try:
        leader = Leadership(db, holder="s1", lease_s=30)
        assert leader.refresh() and leader.epoch is not None
        # The deadline is generous: on a busy machine the second claim below may come seconds later.
        claimed_at = time.monotonic()
        claimed = outbox.claim_deliveries(db, holder="s1", epoch=leader.epoch, limit=10, ack_s=ACK_S)
        assert len(claimed) == 2
        # Held within its acknowledgement deadline: no second claim.
        second = outbox.claim_deliveries(db, holder="s1", epoch=leader.epoch, limit=10, ack_s=ACK_S)
        assert second == [] or time.monotonic() - claimed_at >= ACK_S
        with pytest.raises(NotLeader):
            outbox.settle_deliveries(
                db, [(e, None) for e in claimed], holder="s1", epoch=leader.epoch + 1, policy=DeliveryPolicy()
            )
        again = wait_for(
            lambda: outbox.claim_deliveries(db, holder="s1", epoch=leader.epoch, limit=10, ack_s=5),
            timeout=30,
        )
        assert sorted(e.id for e in again) == sorted(e.id for e in claimed)
        assert (
            outbox.settle_deliveries(
                db, [(e, None) for e in again], holder="s1", epoch=leader.epoch, policy=DeliveryPolicy()
            )
            == 2
        )
    finally:
        runner.close()


def test_backoff_grows_is_capped_and_ends_dead() -> None:
    policy = DeliveryPolicy(max_attempts=5, base_delay_s=1, factor=2, max_delay_s=5, jitter=0)
    assert [after_failure(policy, attempts=n, rand=0.5).delay_s for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    assert after_failure(policy, attempts=5, rand=0.5).dead
    spread = DeliveryPolicy(jitter=0.2)
    assert after_failure(spread, attempts=1, rand=0.0).delay_s == pytest.approx(0.8)
