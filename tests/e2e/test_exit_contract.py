"""The exit-code contract through a real worker and its task processes, and resolving a task that
needs inspection with the CLI (audited)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.store.tables import audit_log

pytestmark = [pytest.mark.e2e]

DAG = """
    from __future__ import annotations

    import sys
    from pathlib import Path

    from treadle import NonRetryable, UnknownCommit, dag, task

    MARKER = Path(__MARKER__)


    @task(exit_codes="standard", retries=3, retry_delay=0)
    def bad_config() -> None:
        sys.exit(10)


    @task(retries=3, retry_delay=0)
    def contract_broken() -> None:
        raise NonRetryable("input has no header", exit_code=30)


    @task(retries=3, retry_delay=0)
    def load() -> int:
        if not MARKER.exists():
            MARKER.write_text("partial")
            raise UnknownCommit("commit timed out")
        return 7


    @task
    def publish(n: int) -> int:
        return n * 6


    @dag(dag_id="contract")
    def contract() -> None:
        bad_config()
        contract_broken()
        publish(load())
"""


def test_exit_codes_outcomes_and_resolution_through_a_worker(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url)
    path = c.write_dag("contract.py", DAG, marker=str(c.root / "marker"))
    code_version = hashlib.sha256(path.read_bytes()).hexdigest()
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "2")
    run_id = c.trigger("contract")

    def settled() -> bool:
        states = {t.task_id: t.state for t in c.detail(run_id).task_instances}
        return states == {
            "bad_config": "dead_letter",
            "contract_broken": "dead_letter",
            "load": "needs_inspection",
            "publish": "pending",
        }

    wait_for(settled, timeout=120, message="each exit class to reach its state")
    detail = c.detail(run_id)
    assert detail.run.state == "running"  # held open by needs_inspection
    by_task = {a.task_id: a for a in detail.attempts}
    assert len(detail.attempts) == 3  # nothing retried
    assert (by_task["bad_config"].outcome, by_task["bad_config"].exit_code) == ("failed", 10)
    assert (by_task["contract_broken"].outcome, by_task["contract_broken"].exit_code) == ("failed", 30)
    assert (by_task["load"].outcome, by_task["load"].exit_code) == ("unknown_commit", 60)
    assert {a.code_version for a in detail.attempts} == {code_version}

    listed = c.cli_json("tasks", "inspection")
    assert [i["task_instance"]["task_id"] for i in listed] == ["load"]
    why = c.cli("why", run_id, "load")
    assert "needs inspection" in why.stdout and "tasks resolve" in why.stdout, why.stdout

    refused = c.cli("tasks", "resolve", run_id, "load", "--as", "success", "--reason", "")
    assert refused.returncode != 0 and "reason is required" in refused.stderr
    done = c.cli("tasks", "resolve", run_id, "load", "--as", "requeue", "--reason", "rolled back by hand")
    assert done.returncode == 0, done.stderr
    final = c.wait_run(run_id, timeout=120)
    assert final.run.state == "failed"  # the two dead letters
    states = {t.task_id: t.state for t in final.task_instances}
    assert (states["load"], states["publish"]) == ("success", "success")
    assert final.results["publish"] == 42
    success = next(a for a in final.attempts if a.task_id == "publish")
    assert (success.exit_code, success.code_version) == (0, code_version)
    with c.db.read() as conn:
        [entry] = conn.execute(sa.select(audit_log).where(audit_log.c.action == "task.resolve")).all()
    assert entry.target == f"{run_id}/load" and entry.details["reason"] == "rolled back by hand"
    assert entry.actor.startswith("cli:")
