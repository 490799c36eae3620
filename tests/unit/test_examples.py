"""The example DAGs load cleanly and behave as their docstrings say (in-process runner)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from treadle.authoring.loader import load_folder
from treadle.testing import DagRunner, exit_with, run_dag

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "dags"
JOBS = EXAMPLES.parent / "jobs"


def test_examples_load_without_errors() -> None:
    loaded = load_folder(EXAMPLES)
    assert loaded.errors == {}
    assert set(loaded.dags) == {
        "daily_sales_report",
        "detached_rebuild",
        "flaky_partner_feed",
        "orders_quality_publish",
        "partitioned_sales",
        "regulatory_snapshot",
        "sales_dashboard",
        "snapshot_job",
    }


def test_daily_sales_report_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREADLE_HOME", str(tmp_path))
    result = run_dag(load_folder(EXAMPLES).dags["daily_sales_report"])
    assert result.state == "success"
    report = result.results["load"]
    assert Path(report["path"]).read_text().startswith("region,total")
    assert report["grand_total"] == pytest.approx(sum(result.results["transform"].values()))
    assert result.results["notify"].startswith("sales report ready")


@pytest.mark.slow  # waits out the example's own retry delays or poll interval
def test_flaky_partner_feed_dead_letters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARTNER_FEED_READY", raising=False)
    dag = load_folder(EXAMPLES).dags["flaky_partner_feed"]
    # Retry delays of the example are seconds long; the structure keeps them, so allow time.
    result = run_dag(dag, timeout_s=30)
    assert result.state == "failed"
    assert result.task_states == {"fetch_feed": "dead_letter", "publish": "upstream_failed"}
    assert [a.outcome for a in result.attempts("fetch_feed")] == ["failed"] * 3


def test_snapshot_job_outcomes_with_a_stand_in_for_java() -> None:
    dag = load_folder(EXAMPLES).dags["snapshot_job"]
    staged = {"rows": 3, "staging": "/tmp/part-00000.csv"}
    result = run_dag(dag, commands={"snapshot": exit_with(0, result=staged)})
    assert result.state == "success"
    assert result.results["publish"] == "snapshot of 3 rows staged at /tmp/part-00000.csv"
    runner = DagRunner(dag, commands={"snapshot": exit_with(30, stderr="contract violation")})
    try:
        failed = runner.run_until_done(runner.trigger())
        assert failed.task_states == {"snapshot": "dead_letter", "publish": "upstream_failed"}
        assert [a.exit_code for a in failed.attempt_history] == [30]
    finally:
        runner.close()


def _compiled_snapshot_job(tmp_path: Path) -> Path:
    """The Java example job compiled with the machine's javac (skipped without one, except in
    CI, where .ci/run installs a JDK)."""
    if shutil.which("javac") is None:
        if os.environ.get("CI"):
            pytest.fail("javac is not installed (.ci/run installs openjdk-17-jdk-headless)")
        pytest.skip("javac is not installed: the Java example is not tested")
    classes = tmp_path / "classes"
    compiled = subprocess.run(
        ["javac", "-d", str(classes), str(JOBS / "snapshot" / "Snapshot.java")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    return classes


@pytest.mark.slow  # waits out the example's own retry delays or poll interval
def test_regulatory_snapshot_runs_sensor_java_gate_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPSHOT_JOB_CLASSPATH", str(_compiled_snapshot_job(tmp_path)))
    monkeypatch.setenv("TREADLE_HOME", str(tmp_path / "home"))
    dag = load_folder(EXAMPLES).dags["regulatory_snapshot"]

    green = run_dag(dag, timeout_s=120)
    assert green.state == "success", green.task_states
    ready = green.results["source_ready"]
    assert (ready["rows"], ready["trailer_count"]) == (4, 4) and len(ready["sha256"]) == 64
    # The sensor waited for a second poke to see the extract's size stable, spending no retry.
    assert [a.outcome for a in green.attempts("source_ready")][-1] == "success"
    [job] = green.attempts("snapshot")
    assert job.exit_code == 0 and job.outputs["metrics"] == {"rows_written": 4}
    assert green.results["check_snapshot"]["state"] == "passed"
    current = Path(green.results["publish"]["current"])
    assert (tmp_path / "home" / "regulatory" / "CURRENT").read_text() == str(current)
    assert (
        current.read_text().splitlines()[0] == "region,total" and len(current.read_text().splitlines()) == 5
    )
    events = {e.dataset: e for e in green.dataset_events}
    assert events["regulatory.daily_snapshot"].extra == {"quality": "passed"}

    blocked = run_dag(dag, conf={"negative_region": True}, timeout_s=120)
    assert blocked.state == "failed"
    assert blocked.task_states["check_snapshot"] == "dead_letter"
    assert blocked.task_states["publish"] == "upstream_failed"
    assert [e.dataset for e in blocked.dataset_events] == ["regulatory.daily_snapshot_checked"]
    assert blocked.dataset_events[0].extra["quality"] == "failed"
    assert (tmp_path / "home" / "regulatory" / "CURRENT").read_text() == str(current)  # untouched

    runner = DagRunner(dag)
    try:
        run_id = runner.trigger({"scenario": "commit_unknown"})
        waiting = runner.run_until_done(run_id, timeout_s=120)
        assert waiting.task_states["snapshot"] == "needs_inspection"
        assert waiting.task_states["publish"] == "pending"
        assert [a.exit_code for a in waiting.attempts("snapshot")] == [60]
        runner.resolve(run_id, "snapshot", as_="failed", reason="sink holds a partial file; rerun tomorrow")
        assert runner.run_until_done(run_id).state == "failed"
    finally:
        runner.close()


def test_partitioned_sales_maps_and_reduces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREADLE_HOME", str(tmp_path))
    result = run_dag(load_folder(EXAMPLES).dags["partitioned_sales"], conf={"stores": 40})
    assert result.state == "success"
    assert result.results["summarize"] == {
        "partitions": 40,
        "rows": 40 * 100 + sum(range(40)),
        "amount": 8610.0,
    }
    assert result.task_states["load_partition[39]"] == "success"


@pytest.mark.slow  # waits out the example's own retry delays or poll interval
def test_detached_rebuild_polls_the_job_and_classifies_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TREADLE_HOME", str(tmp_path))
    dag = load_folder(EXAMPLES).dags["detached_rebuild"]
    done = run_dag(dag, conf={"seconds": 1}, timeout_s=120)
    assert done.state == "success"
    assert done.results["announce"].startswith("rebuild finished with exit code 0")
    unknown = run_dag(dag, conf={"seconds": 0, "exit_code": 60}, timeout_s=120)
    assert unknown.task_states == {"rebuild": "needs_inspection", "announce": "pending"}
