"""Declarative alert rules end to end: real runs on a real database raise occurrences, the rules
of the DAG (or the deployment) decide, the alert goes through the outbox and the leader's relay
to local HTTP receivers, as generic JSON and as a Slack body, with every field; repeats within
the window and backfill runs' alerts are recorded, not sent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers.wait import wait_for
from tests.helpers.webhook import Receiver
from treadle import Alert, Check, Dataset, UnknownCommit, dag, quality_gate, sensor, task
from treadle.authoring.sensing import Waiting
from treadle.delivery import slack, webhook
from treadle.delivery.relay import OutboxRelay, Routes
from treadle.domain.alerts import Alerting, AlertRule
from treadle.domain.outbox import DeliveryPolicy, OutboxKind
from treadle.domain.states import RunType
from treadle.engine import outbox, queries
from treadle.engine.alerts import check_alerts
from treadle.engine.backfill_actions import create_backfill
from treadle.engine.freshness import check_freshness
from treadle.engine.leadership import Leadership
from treadle.engine.runs import trigger_run
from treadle.store import alerts as alert_store
from treadle.store.database import Database
from treadle.testing import DagRunner

UI = "https://treadle.example"
RUNBOOK = "https://runbooks.example/ledger"


@task(retries=0)
def post_ledger() -> None:
    raise RuntimeError("the ledger API answered 502")


@dag(
    dag_id="ledger",
    owner="finance-data",
    failure_impact="the finance close report is late",
    runbook_url=RUNBOOK,
    criticality="high",
    alerts=[Alert("dead_letter", severity="critical"), Alert("consecutive_failures", count=2)],
)
def ledger() -> None:
    post_ledger()


class Receivers:
    def __init__(self) -> None:
        self.hook = Receiver(path="/generic")
        self.slack = Receiver(path="/slack")

    def close(self) -> None:
        self.hook.close()
        self.slack.close()


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    r = Receivers()
    yield r
    r.close()


def _runner(dag_: Any, db_url: str, *, rules: tuple[AlertRule, ...] | None = None) -> DagRunner:
    runner = DagRunner(dag_, database_url=db_url)
    runner.db.outbox_sinks = (webhook.SINK, slack.SINK)
    runner.db.alerting = Alerting(ui_base_url=UI, check_s=0.5, **({} if rules is None else {"rules": rules}))
    return runner


_LEADERS: dict[int, Leadership] = {}


def _leader(db: Database) -> Leadership:
    """The test's one leader per database (a second one would wait for the first's lease)."""
    leader = _LEADERS.get(id(db))
    if leader is None or leader.db is not db:
        leader = _LEADERS[id(db)] = Leadership(db, holder="alerts-test", lease_s=30)
    assert leader.refresh() and leader.epoch is not None
    return leader


def _deliver(db: Database, receivers: Receivers) -> None:
    """One leader relay round for everything due: the generic webhook and the Slack receiver."""
    leader = _leader(db)
    sinks = Routes(
        {
            webhook.SINK: webhook.WebhookSink(receivers.hook.url, secret=None, ack_s=5),
            slack.SINK: slack.SlackSink(receivers.slack.url, ack_s=5),
        }
    )
    relay = OutboxRelay(db, leader, sinks, policy=DeliveryPolicy(max_attempts=3), ack_s=5)
    try:
        relay.round()
    finally:
        relay.pool.shutdown()
        relay.database.shutdown()
        sinks.close()


def _check(db: Database) -> int:
    leader = _leader(db)
    assert leader.epoch is not None
    return check_alerts(db, holder=leader.holder, epoch=leader.epoch)


def _alerts(receivers: Receivers, kind: str) -> list[dict[str, Any]]:
    return [b["payload"] for b in receivers.hook.bodies() if b["payload"].get("alert") == kind]


def test_a_dead_letter_alert_has_every_field_in_both_bodies_and_repeats_are_deduplicated(
    db_url: str, receivers: Receivers
) -> None:
    runner = _runner(ledger, db_url)
    try:
        first = runner.trigger()
        runner.run_until_done(first)
        _deliver(runner.db, receivers)
        (alert,) = _alerts(receivers, "dead_letter")
        assert alert["severity"] == "critical"  # the DAG's rule, not the deployment's
        assert (alert["pipeline"], alert["run_id"], alert["task_id"]) == ("ledger", first, "post_ledger")
        assert alert["impact"] == "the finance close report is late"
        assert alert["owner"] == "finance-data" and alert["criticality"] == "high"
        assert alert["runbook_url"] == RUNBOOK
        assert alert["ui_url"] == f"{UI}/runs/{first}/tasks/post_ledger"
        assert "dead-letters" in alert["next_action"]
        assert "502" in alert["message"] and alert["rule"].startswith("dag:ledger:dead_letter:")
        (message,) = receivers.slack.bodies()
        assert "CRITICAL" in message["text"] and "ledger.post_ledger" in message["text"]
        text = str(message["blocks"])
        for expected in ("ledger", first, "post_ledger", "finance-data", "finance close report", RUNBOOK, UI):
            assert expected in text, expected
        assert message["blocks"][0]["type"] == "header"

        # A second failure of the same task within the window: recorded as a duplicate, not sent.
        second = runner.trigger()
        runner.run_until_done(second)
        assert _check(runner.db) == 1  # ... but two failed runs in a row is the streak rule's
        _deliver(runner.db, receivers)
        assert len(_alerts(receivers, "dead_letter")) == 1
        (streak,) = _alerts(receivers, "consecutive_failures")
        assert (
            streak["run_id"] == second
            and streak["failed_runs"] == 2
            and streak["first_failed_run_id"] == first
        )
        assert streak["ui_url"] == f"{UI}/runs/{second}"
        assert _check(runner.db) == 0  # one alert per streak
        found = runner.db.query(lambda conn: alert_store.firings(conn))
        dispositions = sorted((f.kind, f.disposition) for f in found)
        assert dispositions == [
            ("consecutive_failures", "sent"),
            ("dead_letter", "duplicate"),
            ("dead_letter", "sent"),
        ]
        assert len(receivers.slack.received) == 2
    finally:
        runner.close()


def test_a_streak_is_read_from_the_newest_count_runs_and_past_it_repeats_are_duplicates(
    db_url: str, receivers: Receivers
) -> None:
    runner = _runner(ledger, db_url)  # consecutive_failures count=2: two ended runs are read
    try:
        first = runner.trigger()
        runner.run_until_done(first)
        second = runner.trigger()
        runner.run_until_done(second)
        assert _check(runner.db) == 1
        third = runner.trigger()
        runner.run_until_done(third)
        # Three in a row: the two newest are read, the streak's key slides to `second`, and the
        # repeat about the same DAG within the window is recorded, not sent.
        assert _check(runner.db) == 0
        streaks = [
            f
            for f in runner.db.query(lambda conn: alert_store.firings(conn))
            if f.kind == "consecutive_failures"
        ]
        assert sorted((f.run_id, f.disposition) for f in streaks) == sorted(
            [(second, "sent"), (third, "duplicate")]
        )
        _deliver(runner.db, receivers)
        (streak,) = _alerts(receivers, "consecutive_failures")
        assert streak["first_failed_run_id"] == first and streak["failed_runs"] == 2
    finally:
        runner.close()


@task(retries=0)
def nightly_copy() -> None:
    raise RuntimeError("disk full")


@dag(dag_id="copier", owner="platform")
def copier() -> None:
    nightly_copy()


def test_backfill_runs_are_held_back_unless_the_rule_asks(db_url: str, receivers: Receivers) -> None:
    runner = _runner(copier, db_url, rules=(AlertRule(kind="dead_letter", dedup_s=0),))  # type: ignore[arg-type]
    try:
        held = trigger_run(runner.db, "copier", triggered_by="test", run_type=RunType.BACKFILL).run_id
        runner.run_until_done(held)
        assert [e.kind for e in outbox.list_entries(runner.db)] == []
        runner.db.alerting = Alerting(rules=(AlertRule(kind="dead_letter", backfills=True, dedup_s=0),))  # type: ignore[arg-type]
        asked = trigger_run(runner.db, "copier", triggered_by="test", run_type=RunType.BACKFILL).run_id
        runner.run_until_done(asked)
        _deliver(runner.db, receivers)
        assert [a["run_id"] for a in _alerts(receivers, "dead_letter")] == [asked]
        found = {f.run_id: f.disposition for f in runner.db.query(lambda conn: alert_store.firings(conn))}
        assert found == {held: "backfill", asked: "sent"}
    finally:
        runner.close()


@task
def book_payment() -> None:
    raise UnknownCommit("the bank timed out after the transfer was sent")


@task(retries=3, retry_delay=timedelta(seconds=0.2))
def fetch_rates() -> None:
    raise RuntimeError("rates service 503")


@dag(
    dag_id="payments",
    owner="payments-team",
    failure_impact="suppliers are paid late",
    alerts=[
        Alert("needs_inspection", tasks=["book_payment"]),
        Alert("repeated_retries", count=2),
        Alert("run_over_budget", budget="1s"),
    ],
)
def payments() -> None:
    book_payment()
    fetch_rates()


def _instance(runner: DagRunner, run_id: str, task_id: str) -> Any:
    detail = queries.run_detail(runner.db, run_id)
    return next(t for t in detail.task_instances if t.task_id == task_id)


def test_inspection_retries_and_run_budget_are_checked_by_the_leader(
    db_url: str, receivers: Receivers
) -> None:
    runner = _runner(payments, db_url)
    try:
        run_id = runner.trigger()

        def one_retry() -> bool:
            runner._step(run_id)
            return _instance(runner, run_id, "fetch_rates").attempt >= 1

        wait_for(one_retry, timeout=60, message="fetch_rates failed once")
        assert _instance(runner, run_id, "book_payment").state == "needs_inspection"
        _check(runner.db)
        _deliver(runner.db, receivers)
        assert _alerts(receivers, "repeated_retries") == []  # one retry: below the rule's count

        def two_retries() -> bool:
            runner._step(run_id)
            return _instance(runner, run_id, "fetch_rates").attempt >= 2

        wait_for(two_retries, timeout=60, message="fetch_rates failed twice")
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 1.1, timeout=5)  # past the 1 s run budget
        _check(runner.db)
        _deliver(runner.db, receivers)
        (inspection,) = _alerts(receivers, "needs_inspection")
        assert inspection["task_id"] == "book_payment" and inspection["run_id"] == run_id
        assert (
            "tasks resolve" in inspection["next_action"] and inspection["impact"] == "suppliers are paid late"
        )
        (retries,) = _alerts(receivers, "repeated_retries")
        assert retries["task_id"] == "fetch_rates" and retries["retries"] >= 2
        (budget,) = _alerts(receivers, "run_over_budget")
        assert budget["run_id"] == run_id and budget["running_s"] > 1 and budget["severity"] == "warning"
        _check(runner.db)
        _deliver(runner.db, receivers)
        assert len(receivers.hook.received) == 3  # each once
        kinds = {b["kind"] for b in receivers.hook.bodies()}
        assert kinds == {
            OutboxKind.NEEDS_INSPECTION.value,
            OutboxKind.REPEATED_RETRIES.value,
            OutboxKind.RUN_OVER_BUDGET.value,
        }
    finally:
        runner.close()


@sensor(poke_interval=0.1, timeout=0.3)
def wait_for_export() -> Waiting:
    return Waiting("the export file is not there yet")


@quality_gate
def orders_quality() -> list[Check]:
    return [Check("row_count", passed=False, observed=0, expected=">= 1")]


@dag(dag_id="intake", owner="intake", alerts=[Alert("sensor_timeout"), Alert("quality_gate_failed")])
def intake() -> None:
    wait_for_export()
    orders_quality()


def test_sensor_timeouts_and_failed_quality_gates_alert_with_their_dead_letter(
    db_url: str, receivers: Receivers
) -> None:
    runner = _runner(intake, db_url)
    try:
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        _deliver(runner.db, receivers)
        (timeout,) = _alerts(receivers, "sensor_timeout")
        assert timeout["task_id"] == "wait_for_export" and "source is unavailable" in timeout["summary"]
        (gate,) = _alerts(receivers, "quality_gate_failed")
        assert gate["task_id"] == "orders_quality" and "row_count" in gate["summary"]
        assert gate["quality"]["state"] == "failed"
        # The DAG declares no dead_letter rule: the deployment's default one still applies.
        assert {a["task_id"] for a in _alerts(receivers, "dead_letter")} == {
            "wait_for_export",
            "orders_quality",
        }
    finally:
        runner.close()


DAILY = Dataset("warehouse.jakarta_sales")


@task(outlets=[DAILY])
def load_sales() -> int:
    return 1


@dag(
    dag_id="jakarta_sales",
    owner="apac",
    published_by="06:00 Asia/Jakarta",
    schedule="@daily",
    start_date="2026-01-01",
)
def jakarta_sales() -> None:
    load_sales()


def test_a_missed_publish_by_deadline_alerts_once(db_url: str, receivers: Receivers) -> None:
    runner = _runner(jakarta_sales, db_url)
    try:
        runner.run_until_done(runner.trigger())
        leader = _leader(runner.db)
        assert leader.epoch is not None
        assert check_freshness(runner.db, holder=leader.holder, epoch=leader.epoch) == 0  # just published
        runner.db.transact(
            lambda conn: conn.execute(
                sa.text("UPDATE datasets SET last_event_at = :t"), {"t": "2000-01-01 00:00:00.000000"}
            )
        )
        assert check_freshness(runner.db, holder=leader.holder, epoch=leader.epoch) == 1
        assert check_freshness(runner.db, holder=leader.holder, epoch=leader.epoch) == 0  # once per period
        _deliver(runner.db, receivers)
        (miss,) = _alerts(receivers, "freshness_miss")
        assert miss["published_by"] == "06:00 Asia/Jakarta" and miss["dataset"] == DAILY.name
        assert miss["deadline_at"].endswith("+07:00") and "T06:00:00" in miss["deadline_at"]
        assert "no new version by 06:00 Asia/Jakarta" in miss["summary"]
        kinds = [b["kind"] for b in receivers.hook.bodies()]
        assert sorted(kinds) == [OutboxKind.DATASET_PUBLISHED.value, OutboxKind.FRESHNESS_MISS.value]
        assert [b["text"] for b in receivers.slack.bodies()] == [f":warning: [WARNING] {miss['summary']}"]
    finally:
        runner.close()


def test_a_backfill_over_its_budget_alerts(db_url: str, receivers: Receivers) -> None:
    budget = (AlertRule(kind="backfill_over_budget", budget_s=0.5),)  # type: ignore[arg-type]
    runner = _runner(jakarta_sales, db_url, rules=budget)
    try:
        made = create_backfill(
            runner.db,
            "jakarta_sales",
            from_date="2026-01-01",
            to_date="2026-01-03",
            reason="t",
            requested_by="t",
        )
        wait_for(lambda: _check(runner.db) == 1, timeout=30, message="the backfill past its budget")
        _deliver(runner.db, receivers)
        (alert,) = _alerts(receivers, "backfill_over_budget")
        assert (
            alert["backfill_id"] == made.id
            and alert["total"] == 3
            and "backfills show" in alert["next_action"]
        )
        assert _check(runner.db) == 0
    finally:
        runner.close()
