"""The scheduling commands as a user runs them: `dags next`, params errors, pause/unpause."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster
from treadle.engine import queries

pytestmark = pytest.mark.e2e

SCHEDULED_DAG = """
    from __future__ import annotations

    from treadle import Param, dag, task


    @task
    def report() -> int:
        return 1


    @dag(
        dag_id="singapore_daily",
        schedule="0 2 * * *",
        timezone="Asia/Singapore",
        start_date="2026-07-01",
        params={
            "limit": Param(10, type="integer", minimum=1, description="rows"),
            "region": Param("eu", enum=["eu", "us"]),
        },
    )
    def singapore_daily() -> None:
        report()
"""


def test_next_fire_times_params_errors_and_pause(sqlite_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(sqlite_url)
    c.write_dag("singapore_daily.py", SCHEDULED_DAG)
    assert c.cli("db", "upgrade").returncode == 0
    assert c.cli("dags", "sync").returncode == 0

    shown = c.cli_json("dags", "next", "singapore_daily", "-n", "3", "--after", "2026-07-04T12:00:00+08:00")
    assert [f["fire_at"] for f in shown["fires"]] == [
        "2026-07-04T18:00:00+00:00",
        "2026-07-05T18:00:00+00:00",
        "2026-07-06T18:00:00+00:00",
    ]
    first = shown["fires"][0]
    assert first["fire_at_local"] == "2026-07-05T02:00:00+08:00"
    # "The 2026-07-04 run" covers 2026-07-04 02:00 -> 2026-07-05 02:00 local and fires at its end.
    assert first["logical_date"] == "2026-07-03T18:00:00+00:00"
    assert first["data_interval_end"] == "2026-07-04T18:00:00+00:00"
    table = c.cli("dags", "next", "singapore_daily", "-n", "2", "--after", "2026-07-04T12:00:00")
    assert table.returncode == 0, table.stderr
    assert "2026-07-05 02:00:00 +08" in table.stdout

    bad = c.cli(
        "dags", "trigger", "singapore_daily", "--conf", json.dumps({"limit": 0, "region": "mars", "x": 1})
    )
    assert bad.returncode == 1
    for path in ("$.limit", "$.region", "$.x"):
        assert path in bad.stderr, bad.stderr
    assert queries.list_runs(c.db) == []
    good = c.cli_json("dags", "trigger", "singapore_daily", "--conf", json.dumps({"limit": 5}))
    assert good["params"] == {"limit": 5, "region": "eu"}
    assert good["manifest"]["params"] == {"limit": 5, "region": "eu"}

    assert c.cli("dags", "pause", "singapore_daily").returncode == 0
    listed = {d["dag_id"]: d for d in c.cli_json("dags", "list")}
    assert listed["singapore_daily"]["is_paused"] is True
    assert listed["singapore_daily"]["schedule"]["cron"] == "0 2 * * *"
    again = c.cli("dags", "pause", "singapore_daily")
    assert "already paused" in again.stdout
    assert c.cli("dags", "unpause", "singapore_daily").returncode == 0
    missing = c.cli("dags", "pause", "nope")
    assert missing.returncode == 1 and "nope" in missing.stderr
    bad_time = c.cli("dags", "next", "singapore_daily", "--after", "yesterday")
    assert bad_time.returncode == 1 and "ISO" in bad_time.stderr
