"""A DAG's contract through the real CLI (`dags show`, a refused trigger), and a DAG folder whose
files import a helper module beside them, parsed by the DAG processor and run by a real worker."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.engine import queries

pytestmark = pytest.mark.e2e

CONTRACTED = """
    from __future__ import annotations

    from treadle import Alert, Dataset, Param, ParamRule, dag, task


    @task(outlets=[Dataset("warehouse.sales_daily")], pool="warehouse", retries=2)
    def load() -> int:
        return 3


    @task(timeout=600)
    def report(rows: int) -> str:
        return f"{rows} rows"


    @dag(
        dag_id="sales",
        owner="data-eng",
        schedule="0 2 * * *",
        timezone="Asia/Singapore",
        purpose="Daily sales numbers for finance",
        criticality="high",
        inlets=["raw.orders"],
        freshness_slo="26h",
        published_by="07:30 Asia/Singapore",
        alerts=[
            Alert("consecutive_failures", count=2, severity="critical"),
            Alert("run_over_budget", budget="3h"),
        ],
        failure_impact="the finance dashboard shows stale numbers",
        runbook_url="https://wiki.example.com/runbooks/sales",
        manual_runs=False,
        params={
            "from_date": Param("2026-01-01", type="string", description="first day"),
            "to_date": Param("2026-01-02", type="string"),
            "api_key": Param("k", type="string", format="password"),
        },
        param_rules=[ParamRule.ordered("from_date", "to_date")],
    )
    def sales() -> None:
        report(load())


    sales()  # Airflow's habit: returns the same DAG, defines nothing twice


    @task
    def hello() -> str:
        return "hi"


    @dag(dag_id="adhoc", params={"a": 1, "b": 2}, param_rules=[ParamRule.ordered("a", "b")])
    def adhoc() -> None:
        hello()
"""


def test_dags_show_prints_the_contract_and_a_refused_trigger_says_why(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url, TREADLE_DEFAULT_TASK_TIMEOUT="2h")
    c.write_dag("sales.py", CONTRACTED)
    assert c.cli("db", "upgrade").returncode == 0
    synced = c.cli("dags", "sync")
    assert synced.returncode == 0 and "0 file(s) with load errors" in synced.stdout, synced.stdout

    refused = c.cli("dags", "trigger", "sales")
    assert refused.returncode == 1
    assert "DAG 'sales' does not allow manual runs: its contract sets manual_runs=False" in refused.stderr
    assert queries.list_runs(c.db) == []
    broken = c.cli("dags", "trigger", "adhoc", "--conf", json.dumps({"a": 5, "b": 1, "c": 0}))
    assert broken.returncode == 1
    assert "$.b: must be at least 'a' (5), got 1" in broken.stderr, broken.stderr
    assert "$.c: unknown key 'c'" in broken.stderr
    assert queries.list_runs(c.db) == []
    run_id = c.trigger("adhoc")

    shown = c.cli_json("dags", "show", "sales")
    assert shown["owner"] == "data-eng"
    contract = shown["contract"]
    assert contract["purpose"] == "Daily sales numbers for finance"
    assert contract["criticality"] == "high"
    assert contract["inputs"] == ["raw.orders"]
    assert contract["outputs"] == [
        {"name": "warehouse.sales_daily", "last_event_at": None, "age_s": None, "within_slo": False}
    ]
    assert contract["freshness_slo_s"] == 26 * 3600
    assert contract["published_by"] == "07:30 Asia/Singapore"
    assert contract["alerts"] == [
        {"kind": "consecutive_failures", "count": 2, "severity": "critical"},
        {"kind": "run_over_budget", "budget_s": 10800.0},
    ]
    assert contract["manual_runs"] is False and contract["backfills"] is True
    assert contract["runbook_url"] == "https://wiki.example.com/runbooks/sales"
    schedule = shown["schedule"]
    assert schedule["description"].startswith("At 02:00 every day, Asia/Singapore time")
    assert len(schedule["next_fires"]) == 5
    assert all(f["fire_at_local"].endswith("T02:00:00+08:00") for f in schedule["next_fires"])
    assert [t["task_id"] for t in shown["tasks"]] == ["load", "report"]
    load, report = shown["tasks"]
    assert (load["upstream"], load["pool"], load["retries"]) == ([], "warehouse", 2)
    assert (load["effective_timeout_s"], load["timeout_is_default"]) == (7200, True)
    assert (report["upstream"], report["effective_timeout_s"], report["timeout_is_default"]) == (
        ["load"],
        600,
        False,
    )
    assert set(shown["params"]["schema"]["properties"]) == {"from_date", "to_date", "api_key"}
    assert shown["params"]["rules"][0]["description"] == "from_date <= to_date"
    assert shown["runs"] == []

    text = c.cli("dags", "show", "sales")
    assert text.returncode == 0, text.stderr
    out = text.stdout
    for expected in (
        "Daily sales numbers for finance",
        "refused (manual_runs=False)",
        "07:30 Asia/Singapore",
        "consecutive_failures severity=critical count=2; run_over_budget budget=10800s",
        "https://wiki.example.com/runbooks/sales",
        "STALE (no event yet)",
        "At 02:00 every day, Asia/Singapore time",
        "02:00:00 +08",
        " UTC",
        "2 h (default)",
        "10 min",
        "from_date <= to_date",
        "no runs yet",
    ):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    assert '"k"' not in out  # the secret default is masked

    adhoc = c.cli_json("dags", "show", "adhoc")
    assert [r["run_id"] for r in adhoc["runs"]] == [run_id]
    assert adhoc["runs"][0]["state"] == "running" and adhoc["schedule"]["next_fires"] == []
    adhoc_text = c.cli("dags", "show", "adhoc").stdout
    assert run_id in adhoc_text and "so far" in adhoc_text and "runs only when triggered" in adhoc_text

    missing = c.cli("dags", "show", "nope")
    assert missing.returncode == 1 and "no DAG 'nope' is registered" in missing.stderr


HELPER = """
    VALUE = __VALUE__
    RETRIES = __RETRIES__
"""

USES_HELPER = """
    from __future__ import annotations

    import team_helpers
    from treadle import dag, task


    @task(retries=team_helpers.RETRIES)
    def greet() -> str:
        return team_helpers.VALUE


    @dag(dag_id="uses_helper")
    def uses_helper() -> None:
        greet()
"""


def test_a_dag_file_importing_a_helper_loads_and_runs_in_a_worker(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url, TREADLE_DAG_REFRESH_SECONDS="0.2")
    c.write_dag("team_helpers.py", HELPER, value="from the helper", retries=0)
    c.write_dag("uses_helper.py", USES_HELPER)
    assert c.cli("db", "upgrade").returncode == 0
    c.start("standalone", "standalone")
    c.wait_dag("uses_helper")
    assert queries.list_load_errors(c.db) == []

    detail = c.wait_run(c.trigger("uses_helper"))
    assert detail.run.state == "success"
    assert detail.results["greet"] == "from the helper"

    # A changed helper is imported afresh: by the DAG processor (a new version, since it sets the
    # task's retries) and by the task process that runs that version.
    first_version = detail.run.dag_version_id
    path = c.write_dag("team_helpers.py", HELPER, value="changed helper", retries=1)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))

    def new_version() -> bool:
        found = queries.get_dag(c.db, "uses_helper")
        return found is not None and found.latest_version_id not in (None, first_version)

    wait_for(new_version, timeout=60, interval=0.2, message="the new version of uses_helper")
    again = c.wait_run(c.trigger("uses_helper"))
    assert again.run.state == "success"
    assert again.results["greet"] == "changed helper"
    assert Path(queries.get_dag(c.db, "uses_helper").fileloc).name == "uses_helper.py"  # type: ignore[union-attr]
