"""Quality gates: a failed BLOCKER fails the gate at once, prevents the publish and marks the
dataset event (which triggers nothing); a failed WARN is only recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from treadle import Check, Dataset, dag, quality_gate, task
from treadle.authoring.loader import load_folder
from treadle.authoring.quality import evaluate
from treadle.engine import datasets as dataset_engine
from treadle.store.database import Database
from treadle.testing import DagRunner, run_dag

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "dags"


def test_the_example_publishes_a_good_version_and_stops_a_bad_one(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TREADLE_HOME", str(tmp_path))
    example = load_folder(EXAMPLES).dags["orders_quality_publish"]
    runner = DagRunner(example, database_url=db_url)
    try:
        good = runner.run_until_done(runner.trigger({"late_rows": 7}))
        assert good.state == "success"
        assert good.results["check_orders"]["state"] == "warn"  # WARN failed: recorded only
        pointer = tmp_path / "warehouse" / "orders" / "CURRENT"
        published = pointer.read_text()
        assert Path(published).exists() and good.results["publish"]["quality"] == "warn"

        bad = runner.run_until_done(runner.trigger({"negative_amounts": 3}))
        assert bad.state == "failed"
        assert bad.task_states == {
            "stage": "success",
            "check_orders": "dead_letter",
            "publish": "upstream_failed",
        }
        [gate] = bad.attempts("check_orders")  # never retried
        assert (gate.outcome, gate.error_type, gate.exit_code) == ("failed", "QualityGateFailed", 40)
        assert "negative_amounts (observed 3, expected 0)" in (gate.error_message or "")
        assert gate.outputs is not None
        quality = gate.outputs["quality"]
        assert quality["state"] == "failed"
        assert {c["name"]: c["passed"] for c in quality["checks"]} == {
            "row_count": True,
            "negative_amounts": False,
            "late_rows": True,
        }
        assert pointer.read_text() == published  # the publish never ran

        events = dataset_engine.dataset_events(runner.db, "warehouse.orders_checked")
        assert [e.extra.get("quality") for e in events] == ["failed", "warn"]  # newest first
        assert _newest_event(runner.db, "warehouse.orders_checked") == events[1].id  # the failed one is not
    finally:
        runner.close()


def _newest_event(db: Database, name: str) -> int | None:
    [view] = [d for d in dataset_engine.list_datasets(db) if d.name == name]
    return view.last_event_id


@quality_gate
def bad_return() -> Any:
    return "all good"


@quality_gate(retries=3, retry_delay=0)
def blocker_only(n: int) -> list[Check]:
    return [Check("positive", passed=n > 0, observed=n, expected="> 0")]


@task
def source() -> int:
    return 0


def test_a_gate_that_returns_no_checks_fails_clearly() -> None:
    @dag(dag_id="bad_gate")
    def bad_gate() -> None:
        bad_return()

    result = run_dag(bad_gate)
    [attempt] = result.attempt_history
    assert attempt.error_type == "NonRetryable" and "list of Check" in (attempt.error_message or "")


def test_failed_checks_are_never_retried_whatever_the_budget() -> None:
    @dag(dag_id="gate_budget")
    def gate_budget() -> None:
        blocker_only(source())

    result = run_dag(gate_budget)
    assert [a.outcome for a in result.attempts("blocker_only")] == ["failed"]


def test_evaluate_validates_checks() -> None:
    assert evaluate([Check("a", passed=True)])["state"] == "passed"
    assert evaluate([{"name": "a", "passed": False, "severity": "warn"}])["state"] == "warn"
    with pytest.raises(ValueError, match="severity must be BLOCKER or WARN"):
        evaluate([Check("a", passed=True, severity="fatal")])
    with pytest.raises(ValueError, match="unique"):
        evaluate([Check("a", passed=True), Check("a", passed=False)])
    with pytest.raises(ValueError, match="must have name and passed"):
        evaluate([{"name": "a"}])


def test_gate_outlets_need_declared_datasets() -> None:
    @quality_gate(outlets=[Dataset("x.checked")])
    def gate(context: Any) -> list[Check]:
        assert context.outlets == ("x.checked",)
        return [Check("ok", passed=True)]

    @dag(dag_id="gate_ctx")
    def gate_ctx() -> None:
        gate()

    result = run_dag(gate_ctx)
    assert result.state == "success"
    assert [e.extra for e in result.dataset_events] == [{"quality": "passed"}]
