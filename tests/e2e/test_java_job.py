"""The Java example (examples/jobs/snapshot, examples/dags/snapshot_job.py) end to end: compiled
with the machine's javac, run by a real worker, each scenario ending in its contract class."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _require_javac() -> None:
    """Skip without javac (saying so); in CI, fail: .ci/run installs openjdk-17-jdk-headless."""
    if shutil.which("javac") is None:
        message = (
            "javac is not installed (.ci/run installs openjdk-17-jdk-headless): "
            "the Java example is not tested"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def test_java_snapshot_job_runs_each_scenario(db_url: str, cluster: Callable[..., Cluster]) -> None:
    _require_javac()
    c = cluster(db_url)
    # The layout of examples/: the DAG finds the job relative to its own file.
    job_dir = c.root / "jobs" / "snapshot"
    job_dir.mkdir(parents=True)
    shutil.copy(EXAMPLES / "jobs" / "snapshot" / "Snapshot.java", job_dir)
    compiled = subprocess.run(
        ["javac", "-d", str(job_dir / "classes"), str(job_dir / "Snapshot.java")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    shutil.copy(EXAMPLES / "dags" / "snapshot_job.py", c.dags)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "4")
    runs = {
        s: c.trigger("snapshot_job", {"scenario": s})
        for s in ("ok", "not_ready", "bad_input", "commit_unknown")
    }

    ok = c.wait_run(runs["ok"], timeout=180)
    assert ok.run.state == "success"
    assert ok.results["snapshot"]["rows"] == 3
    assert ok.results["publish"].startswith("snapshot of 3 rows staged at ")
    staged = Path(ok.results["snapshot"]["staging"])
    assert staged.read_text().startswith("region,total")
    assert staged.is_relative_to(c.home / "runs" / runs["ok"] / "outputs" / "snapshot" / "1")
    [job] = [a for a in ok.attempts if a.task_id == "snapshot"]
    assert (job.exit_code, job.outputs) == (
        0,
        {
            "metrics": {"rows_written": 3},
            "lineage": {"inputs": ["warehouse.sales"], "outputs": [str(staged)]},
        },
    )
    shown = c.cli("logs", runs["ok"], "snapshot")
    assert shown.returncode == 0 and "staged 3 rows" in shown.stdout, shown.stderr

    def states(run_id: str) -> dict[str, str]:
        return {t.task_id: t.state for t in c.detail(run_id).task_instances}

    wait_for(
        lambda: states(runs["commit_unknown"])["snapshot"] == "needs_inspection",
        timeout=180,
        message="the unknown commit to wait for inspection",
    )
    bad = c.wait_run(runs["bad_input"], timeout=180)
    not_ready = c.wait_run(runs["not_ready"], timeout=180)
    assert [(a.outcome, a.exit_code) for a in bad.attempts] == [("failed", 30)]
    assert "negative values" in (bad.attempts[0].error_message or "")
    assert bad.attempts[0].outputs == {"error-report": {"column": "amount", "problem": "negative values"}}
    assert [(a.outcome, a.exit_code) for a in not_ready.attempts] == [("failed", 20)] * 3
    unknown = c.detail(runs["commit_unknown"])
    [attempt] = unknown.attempts
    assert (attempt.outcome, attempt.exit_code) == ("unknown_commit", 60)
    assert attempt.outputs is not None and attempt.outputs["sink-commit"]["status"] == "unknown"
