"""`treadle datasets freshness`: each output of a DAG with a freshness SLO against that SLO,
never published, then fresh once its producer ran, then stale once older than the SLO."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from treadle import Dataset, dag, task
from treadle.cli.main import cli
from treadle.delivery.webhook import SINK
from treadle.domain.freshness import Output, misses
from treadle.domain.outbox import OutboxKind
from treadle.engine import outbox
from treadle.engine.dag_detail import dataset_freshness
from treadle.engine.freshness import check_freshness
from treadle.engine.leadership import Leadership
from treadle.errors import NotLeader
from treadle.store.tables import datasets
from treadle.testing import DagRunner

DAILY = Dataset("warehouse.daily_sales")


@task(outlets=[DAILY])
def publish() -> int:
    return 1


@dag(dag_id="daily_sales", owner="sales-data", freshness_slo="26h")
def daily_sales() -> None:
    publish()


HOURLY = Dataset("warehouse.hourly")


@task(outlets=[HOURLY])
def hourly_load() -> int:
    return 1


@dag(
    dag_id="hourly",
    owner="ops",
    freshness_slo="1h",
    failure_impact="the dashboard shows yesterday",
    runbook_url="https://runbooks/hourly",
)
def contracted() -> None:
    hourly_load()


@dag(dag_id="no_slo")
def no_slo() -> None:
    publish()


def test_freshness_against_the_slo(sqlite_url: str) -> None:
    runner = DagRunner(daily_sales, database_url=sqlite_url)
    other = DagRunner(no_slo, database_url=sqlite_url)  # outputs without an SLO are not listed
    try:
        _, before = dataset_freshness(runner.db)
        assert [(f.dataset, f.dag_id, f.age_s, f.within_slo) for f in before] == [
            (DAILY.name, "daily_sales", None, False)
        ]
        runner.run_until_done(runner.trigger())
        now, after = dataset_freshness(runner.db)
        (fresh,) = after
        assert fresh.last_event_at is not None and fresh.last_event_at <= now
        assert fresh.within_slo and fresh.slo_s == 26 * 3600 and fresh.owner == "sales-data"
        assert fresh.age_s is not None and 0 <= fresh.age_s < 600
        runner.db.transact(
            lambda conn: conn.exec_driver_sql(
                "UPDATE datasets SET last_event_at = ?", ("2000-01-01 00:00:00.000000",)
            )
        )
        (stale,) = dataset_freshness(runner.db)[1]
        assert not stale.within_slo and stale.age_s is not None and stale.age_s > 26 * 3600

        shown = CliRunner().invoke(
            cli, ["datasets", "freshness", "--json"], env={"TREADLE_DATABASE_URL": sqlite_url}
        )
        assert shown.exit_code == 0, shown.output
        (row,) = json.loads(shown.output)
        assert (row["dataset"], row["dag_id"], row["within_slo"]) == (DAILY.name, "daily_sales", False)
        table = CliRunner().invoke(cli, ["datasets", "freshness"], env={"TREADLE_DATABASE_URL": sqlite_url})
        assert table.exit_code == 0 and "STALE" in table.output, table.output
    finally:
        runner.close()
        other.close()


def test_misses_with_a_controlled_clock() -> None:
    published = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
    outputs = [
        Output(dag_id="d", dataset="fresh", slo_s=26 * 3600, last_event_at=published),
        Output(dag_id="d", dataset="never", slo_s=3600, last_event_at=None),
    ]
    assert misses(outputs, now=published + timedelta(hours=26)) == []  # at the limit: still fresh
    (late,) = misses(outputs, now=published + timedelta(hours=26, seconds=1))
    assert (late.dataset, late.age_s, late.period) == ("fresh", 26 * 3600 + 1, published.isoformat())
    (later,) = misses(outputs, now=published + timedelta(hours=30))
    assert later.key == late.key  # the same miss until a new version is published
    republished = [
        Output(dag_id="d", dataset="fresh", slo_s=26 * 3600, last_event_at=published + timedelta(days=1))
    ]
    (next_miss,) = misses(republished, now=published + timedelta(days=3))
    assert next_miss.key != late.key


def test_the_leader_alerts_a_miss_once_with_the_contract(db_url: str) -> None:
    runner = DagRunner(contracted, database_url=db_url)
    db = runner.db
    try:
        leader = Leadership(db, holder="s1", lease_s=30)
        assert leader.refresh() and leader.epoch is not None
        assert check_freshness(db, holder="s1", epoch=leader.epoch) == 0  # no sink: nothing to alert
        db.outbox_sinks = (SINK,)
        runner.run_until_done(runner.trigger())
        assert check_freshness(db, holder="s1", epoch=leader.epoch) == 0  # just published
        old = datetime(2000, 1, 1, tzinfo=UTC)
        db.transact(lambda conn: conn.execute(sa.update(datasets).values(last_event_at=old)))
        assert check_freshness(db, holder="s1", epoch=leader.epoch) == 1
        assert check_freshness(db, holder="s1", epoch=leader.epoch) == 0  # once per miss
        with pytest.raises(NotLeader):
            check_freshness(db, holder="s1", epoch=leader.epoch + 1)
        (alert,) = [e for e in outbox.list_entries(db) if e.kind == OutboxKind.FRESHNESS_MISS]
        p = alert.payload
        assert (p["dag_id"], p["dataset"], p["slo_s"], p["owner"]) == ("hourly", HOURLY.name, 3600, "ops")
        assert (
            p["impact"] == "the dashboard shows yesterday" and p["runbook_url"] == "https://runbooks/hourly"
        )
        assert p["age_s"] > 20 * 365 * 86400 and p["next_action"]
    finally:
        runner.close()


JAKARTA = Dataset("warehouse.jakarta_orders")


@task(outlets=[JAKARTA])
def load_orders() -> int:
    return 1


@dag(dag_id="jakarta_orders", owner="apac", published_by="06:00 Asia/Jakarta")
def jakarta_orders() -> None:
    load_orders()


def test_datasets_freshness_shows_the_published_by_deadline(sqlite_url: str) -> None:
    runner = DagRunner(jakarta_orders, database_url=sqlite_url)
    try:
        runner.run_until_done(runner.trigger())
        now, (fresh,) = dataset_freshness(runner.db)
        assert fresh.published_by == "06:00 Asia/Jakarta" and fresh.slo_s is None
        assert fresh.deadline_at is not None and fresh.next_deadline_at is not None
        assert fresh.deadline_at <= now < fresh.next_deadline_at
        assert fresh.next_deadline_at - fresh.deadline_at == timedelta(days=1)  # Jakarta keeps no DST
        assert fresh.met_deadline and fresh.within_slo
        old = datetime(2000, 1, 1, tzinfo=UTC)
        runner.db.transact(lambda conn: conn.execute(sa.update(datasets).values(last_event_at=old)))
        (late,) = dataset_freshness(runner.db)[1]
        assert late.met_deadline is False and not late.within_slo
        env = {"TREADLE_DATABASE_URL": sqlite_url}
        table = CliRunner().invoke(cli, ["datasets", "freshness"], env=env)
        assert table.exit_code == 0, table.output
        assert "06:00 Asia/Jakarta" in table.output and "LATE" in table.output
        (row,) = json.loads(CliRunner().invoke(cli, ["datasets", "freshness", "--json"], env=env).output)
        assert row["published_by"] == "06:00 Asia/Jakarta" and row["met_deadline"] is False
    finally:
        runner.close()


ORDERS_RAW = Dataset("lake.orders_raw")
ORDERS_MART = Dataset("mart.orders", published_by="07:00 Europe/Berlin")


@task(outlets=[ORDERS_RAW, Dataset("mart.orders")])
def build_orders() -> int:
    return 1


@dag(dag_id="orders_mart", owner="orders", freshness_slo="2h", outlets=[ORDERS_MART])
def orders_mart() -> None:
    build_orders()


def test_a_dataset_declares_its_own_slo_which_replaces_the_dags(db_url: str) -> None:
    runner = DagRunner(orders_mart, database_url=db_url)
    db = runner.db
    try:
        runner.run_until_done(runner.trigger())
        _, found = dataset_freshness(db)
        by_name = {f.dataset: f for f in found}
        assert (by_name["lake.orders_raw"].slo_s, by_name["lake.orders_raw"].published_by) == (7200, None)
        assert (by_name["mart.orders"].slo_s, by_name["mart.orders"].published_by) == (
            None,
            "07:00 Europe/Berlin",
        )
        db.outbox_sinks = (SINK,)
        leader = Leadership(db, holder="s1", lease_s=30)
        assert leader.refresh() and leader.epoch is not None
        old = datetime(2000, 1, 1, tzinfo=UTC)
        db.transact(lambda conn: conn.execute(sa.update(datasets).values(last_event_at=old)))
        assert check_freshness(db, holder="s1", epoch=leader.epoch) == 2
        alerts = {
            e.payload["dataset"]: e.payload
            for e in outbox.list_entries(db)
            if e.kind == OutboxKind.FRESHNESS_MISS
        }
        assert (
            alerts["lake.orders_raw"]["slo_s"] == 7200 and alerts["lake.orders_raw"]["published_by"] is None
        )
        assert alerts["mart.orders"]["published_by"] == "07:00 Europe/Berlin"
        assert alerts["mart.orders"]["slo_s"] is None  # the DAG's 2 h is replaced by the dataset's own
    finally:
        runner.close()
