"""CLI smoke test against a running `treadle standalone`: tables for people, JSON for scripts,
clear errors with a non-zero exit for bad input."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.processes import run_cli, running, treadle_env
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.e2e

REPORT_DAG = """
    from __future__ import annotations

    from treadle import TaskContext, dag, task


    @task
    def extract(context: TaskContext) -> list[int]:
        return list(range(context.params.get("rows", 3)))


    @task
    def summarise(rows: list[int]) -> dict:
        return {"count": len(rows), "total": sum(rows)}


    @task
    def publish(summary: dict, context: TaskContext) -> str:
        return f"{context.params.get('title', 'report')}: {summary['count']} rows, total {summary['total']}"


    @dag(dag_id="report")
    def report() -> None:
        publish(summarise(extract()))
"""


def test_cli_smoke(sqlite_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(sqlite_url)
    c.write_dag("report.py", REPORT_DAG)
    c.start("standalone", "standalone", "--concurrency", "2")
    c.wait_dag("report")
    run_id = c.trigger("report", {"rows": 4, "title": "weekly"})
    assert c.wait_run(run_id, timeout=30).run.state == "success"

    # A readable table: the run header, every task with its state and result, every attempt.
    shown = c.cli("runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"run {run_id}  dag report  state success" in out
    assert '"title": "weekly"' in out
    assert "Task instances" in out and "Attempts" in out
    for task_id in ("extract", "summarise", "publish"):
        line = next(line for line in out.splitlines() if line.startswith(f"{task_id} "))
        assert "success" in line, line
    assert '"weekly: 4 rows, total 6"' in out
    assert "Traceback" not in out + shown.stderr

    detail = c.cli_json("runs", "show", run_id)
    assert detail["run"]["state"] == "success"
    assert detail["run"]["conf"] == {"rows": 4, "title": "weekly"}
    assert detail["results"] == {
        "extract": [0, 1, 2, 3],
        "summarise": {"count": 4, "total": 6},
        "publish": "weekly: 4 rows, total 6",
    }
    assert sorted((a["task_id"], a["attempt"], a["outcome"]) for a in detail["attempts"]) == [
        ("extract", 1, "success"),
        ("publish", 1, "success"),
        ("summarise", 1, "success"),
    ]
    assert [r["run_id"] for r in c.cli_json("runs", "list", "report")] == [run_id]
    assert [d["dag_id"] for d in c.cli_json("dags", "list")] == ["report"]
    assert c.cli_json("dead-letters", "list") == []
    assert c.cli_json("dead-letters", "list", "--group") == []
    assert "report" in c.cli("runs", "list").stdout

    # `tasks test` runs one task in-process with given upstream results and conf.
    tested = c.cli(
        "tasks", "test", "report", "publish", "--upstream", 'summarise={"count": 2, "total": 9}',
        "--conf", '{"title": "adhoc"}',
    )  # fmt: skip
    assert tested.returncode == 0, tested.stderr
    assert json.loads(tested.stdout) == "adhoc: 2 rows, total 9"
    tested = c.cli("tasks", "test", "report", "summarise", "--upstream", "extract=[5, 6]")
    assert tested.returncode == 0, tested.stderr
    assert json.loads(tested.stdout) == {"count": 2, "total": 11}

    # Bad input: one clear line on stderr, non-zero exit, no traceback, nothing recorded.
    bad_inputs = {
        ("dags", "trigger", "report", "--conf", "{not json"): "error: --conf is not valid JSON",
        ("dags", "trigger", "report", "--conf", "[1, 2]"): "error: --conf must be a JSON object",
        ("dags", "trigger", "nope"): "error: no DAG 'nope' is registered",
        ("runs", "show", "no-such-run"): "error: no run 'no-such-run'",
        ("tasks", "test", "report", "summarise"): "pass them with --upstream TASK_ID=JSON",
        ("tasks", "test", "report", "summarise", "--upstream", "extract"): "must look like TASK_ID=JSON",
        (
            "tasks",
            "test",
            "report",
            "summarise",
            "--upstream",
            "extract=[1,",
        ): "--upstream extract: invalid JSON",
        (
            "tasks",
            "test",
            "report",
            "nope",
        ): "DAG 'report' has no task 'nope'; tasks: extract, publish, summarise",
        ("tasks", "test", "report", "extract", "--conf", "{bad"): "error: --conf is not valid JSON",
    }
    for args, message in bad_inputs.items():
        done = c.cli(*args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
    assert len(c.cli_json("runs", "list")) == 1
    assert c.procs["standalone"].poll() is None


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """A umask of 022 (files 0644, directories 0755) for this process and what it starts."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("permissive_umask")
def test_home_database_and_its_wal_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    home = tmp_path / "home"
    database = home / "treadle.db"
    env = treadle_env(database_url=f"sqlite:///{database}", dags_folder=tmp_path / "dags", home=home)

    upgraded = run_cli(["db", "upgrade"], env)
    assert upgraded.returncode == 0, upgraded.stderr
    assert _mode(home) == 0o700
    assert _mode(database) == 0o600

    # A running process keeps its connections open, so the -wal and -shm files stay to be seen.
    with running(["standalone"], env, tmp_path / "standalone.log") as standalone:
        written = run_cli(["pools", "set", "warehouse", "4"], env)
        assert written.returncode == 0, written.stderr
        wal, shm = Path(f"{database}-wal"), Path(f"{database}-shm")
        wait_for(lambda: wal.exists() and shm.exists(), timeout=30, message="the -wal and -shm files")
        assert {p.name: _mode(p) for p in (database, wal, shm)} == {
            "treadle.db": 0o600,
            "treadle.db-wal": 0o600,
            "treadle.db-shm": 0o600,
        }
        assert standalone.poll() is None
    assert _mode(home) == 0o700


SECRET_DAG = """
    from __future__ import annotations

    import json
    import os

    from treadle import Param, TaskContext, dag, task

    OUT = __OUT__


    @task
    def uses_secret(context: TaskContext) -> str:
        with open(os.environ["TREADLE_MANIFEST_FILE"]) as f:
            in_manifest = json.load(f)["params"]["password"]
        with open(OUT, "w") as f:
            json.dump({"params": context.params["password"], "manifest_file": in_manifest}, f)
        return "done"


    @dag(dag_id="secretive", params={"password": Param("", type="string", format="password")})
    def secretive() -> None:
        uses_secret()
"""


def test_secret_params_reach_the_task_but_never_the_operator(
    sqlite_url: str, cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    canary = "canary-5f1d2e"
    received = tmp_path / "received.json"
    c = cluster(sqlite_url)
    c.write_dag("secretive.py", SECRET_DAG, out=str(received))
    c.start("standalone", "standalone")
    c.wait_dag("secretive")
    triggered = c.cli("dags", "trigger", "secretive", "--conf", json.dumps({"password": canary}), "--json")
    assert triggered.returncode == 0, triggered.stderr
    assert canary not in triggered.stdout
    run_id = json.loads(triggered.stdout)["run_id"]
    assert c.wait_run(run_id, timeout=30).run.state == "success"

    assert json.loads(received.read_text()) == {"params": canary, "manifest_file": canary}
    shown = c.cli_json("runs", "show", run_id)
    assert canary not in json.dumps(shown)
    assert shown["run"]["params"] == {"password": "***"}
    assert shown["run"]["conf"] == {"password": "***"}
    assert shown["run"]["manifest"]["params"] == {"password": "***"}
    table = c.cli("runs", "show", run_id)
    assert table.returncode == 0, table.stderr
    assert canary not in table.stdout and '"password": "***"' in table.stdout
    listed = c.cli("runs", "list", "--json")
    assert listed.returncode == 0 and run_id in listed.stdout and canary not in listed.stdout
    assert canary not in c.log("standalone")
