"""`treadle tasks clear` against a running `treadle standalone`: a dead letter and its downstream
run again after the fix; unfinished or blocked tasks are refused with a clear message."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

FRAGILE_DAG = """
    from __future__ import annotations

    from pathlib import Path

    from treadle import dag, task


    @task(retries=0)
    def fragile() -> str:
        if not Path(__FLAG__).exists():
            raise ValueError("input file missing")
        return "ok"


    @task
    def after(value: str) -> str:
        return value + "!"


    @dag(dag_id="fragile")
    def fragile_dag() -> None:
        after(fragile())
"""


def test_clear_dead_letter_and_downstream(
    sqlite_url: str, cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    flag = tmp_path / "input.csv"
    c = cluster(sqlite_url)
    c.write_dag("fragile.py", FRAGILE_DAG, flag=str(flag))
    c.start("standalone", "standalone", "--concurrency", "2")
    c.wait_dag("fragile")
    run_id = c.trigger("fragile")
    failed = c.wait_run(run_id, timeout=30)
    assert failed.run.state == "failed"
    assert {t.task_id: t.state for t in failed.task_instances} == {
        "fragile": "dead_letter",
        "after": "upstream_failed",
    }

    refused = {
        ("tasks", "clear", run_id, "after"): "'after' could never run: its upstream fragile (dead_letter)",
        ("tasks", "clear", run_id, "nope"): f"error: run '{run_id}' has no task 'nope'",
        ("tasks", "clear", "no-such-run", "fragile"): "error: no run 'no-such-run'",
    }
    for args, message in refused.items():
        done = c.cli(*args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    missing = c.cli("tasks", "clear", run_id)
    assert missing.returncode == 2 and "Missing argument 'TASK_IDS...'" in missing.stderr

    flag.write_text("ok")
    cleared = c.cli("tasks", "clear", run_id, "fragile", "--downstream", "--reason", "input restored")
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.strip() == f"cleared 2 task(s) of run {run_id}: fragile, after"
    fixed = c.wait_run(run_id, timeout=30)
    assert fixed.run.state == "success"
    assert fixed.results == {"fragile": "ok", "after": "ok!"}
    assert [(a.task_id, a.attempt, a.outcome) for a in fixed.attempts] == [
        ("after", 1, "success"),
        ("fragile", 1, "failed"),
        ("fragile", 2, "success"),
    ]

    again = c.cli_json("tasks", "clear", run_id, "after", "--reason", "rerun the last step")
    assert again == {"run_id": run_id, "cleared": ["after"]}
    assert c.wait_run(run_id, timeout=30).run.state == "success"
