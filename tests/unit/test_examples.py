"""The example DAGs load cleanly and behave as their docstrings say (in-process runner)."""

from __future__ import annotations

from pathlib import Path

import pytest

from treadle.authoring.loader import load_folder
from treadle.testing import DagRunner, exit_with, run_dag

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "dags"


def test_examples_load_without_errors() -> None:
    loaded = load_folder(EXAMPLES)
    assert loaded.errors == {}
    assert set(loaded.dags) == {
        "daily_sales_report",
        "flaky_partner_feed",
        "orders_quality_publish",
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
