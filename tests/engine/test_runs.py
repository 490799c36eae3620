"""End to end through the engine on SQLite and PostgreSQL: results, retries, dead letters."""

from __future__ import annotations

from pathlib import Path

from tests.engine.dags_for_tests import flaky_dag, four_steps, make_failing_dag
from treadle.domain.retry import RetryPolicy
from treadle.engine import dead_letters
from treadle.testing import DagRunner, run_dag


def test_four_task_dag_passes_results_downstream(db_url: str) -> None:
    result = run_dag(four_steps, database_url=db_url)

    assert result.state == "success"
    assert set(result.task_states.values()) == {"success"}
    assert result.results["transform"] == {"total": 10, "count": 4}
    assert result.results["load"] == {"loaded": 10, "from": ["transform"]}
    assert result.results["notify"] == "loaded 10"
    assert all(a.outcome == "success" for a in result.attempt_history)


def test_flaky_task_succeeds_on_third_attempt_within_backoff(db_url: str) -> None:
    result = run_dag(flaky_dag, database_url=db_url)

    attempts = result.attempts("flaky")
    assert result.state == "success"
    assert [a.outcome for a in attempts] == ["failed", "failed", "success"]
    assert result.results["flaky"] == 3
    policy = RetryPolicy(retries=3, retry_delay_s=0.2, backoff_factor=2.0, jitter=0.5, max_retry_delay_s=10)
    for n, attempt in enumerate(attempts[:2], start=1):
        low, high = policy.delay_range(n)
        assert attempt.retry_delay_s is not None
        assert low <= attempt.retry_delay_s <= high
        # The next attempt never starts before the recorded delay has passed (database clock).
        nxt = attempts[n]
        assert nxt.started_at is not None
        waited = (nxt.started_at - attempt.ended_at).total_seconds()
        assert waited >= attempt.retry_delay_s - 0.002


def test_dead_letter_then_requeue_after_fix(db_url: str, tmp_path: Path) -> None:
    flag = tmp_path / "input.csv"
    runner = DagRunner(make_failing_dag(flag), database_url=db_url)
    try:
        run_id = runner.trigger()
        failed = runner.run_until_done(run_id)
        assert failed.state == "failed"
        assert failed.task_states == {
            "fragile": "dead_letter",
            "after": "upstream_failed",
            "last": "upstream_failed",
            "independent": "success",
        }
        assert [a.outcome for a in failed.attempts("fragile")] == ["failed", "failed"]

        letters = dead_letters.list_dead_letters(runner.db)
        assert len(letters) == 1
        assert letters[0].task_instance.dead_letter_reason == "retries_exhausted"
        groups = dead_letters.group_dead_letters(letters)
        assert groups[0].count == 1 and groups[0].error_type == "ValueError"

        flag.write_text("ok")
        dead_letters.requeue_fingerprint(runner.db, groups[0].fingerprint)
        reopened = runner.result(run_id)
        assert reopened.state == "running"
        assert reopened.task_states["after"] == "pending"

        fixed = runner.run_until_done(run_id)
        assert fixed.state == "success"
        assert fixed.results["last"] == "fixed!!"
        # A fresh budget: the requeued attempt is number 3 and history keeps all three.
        assert [a.attempt for a in fixed.attempts("fragile")] == [1, 2, 3]
        assert dead_letters.list_dead_letters(runner.db) == []
    finally:
        runner.close()


def test_manual_triggers_in_one_clock_tick_all_create_runs(db_url: str) -> None:
    runner = DagRunner(four_steps, database_url=db_url)
    try:
        run_ids = {runner.trigger() for _ in range(20)}
        assert len(run_ids) == 20
    finally:
        runner.close()
