"""`treadle datasets freshness`: each output of a DAG with a freshness SLO against that SLO,
never published, then fresh once its producer ran, then stale once older than the SLO."""

from __future__ import annotations

import json

from click.testing import CliRunner

from treadle import Dataset, dag, task
from treadle.cli.main import cli
from treadle.engine.dag_detail import dataset_freshness
from treadle.testing import DagRunner

DAILY = Dataset("warehouse.daily_sales")


@task(outlets=[DAILY])
def publish() -> int:
    return 1


@dag(dag_id="daily_sales", owner="sales-data", freshness_slo="26h")
def daily_sales() -> None:
    publish()


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
