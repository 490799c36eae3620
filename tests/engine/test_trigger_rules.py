"""Trigger rules and branches end to end through the engine, on every database: failed and
skipped upstreams, skip propagation, runs whose leaves were skipped, requeue and clear."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from treadle import dag, task
from treadle.engine import dead_letters
from treadle.engine.clearing import clear_tasks
from treadle.errors import InvalidRequest
from treadle.store.tables import task_instances
from treadle.testing import DagRunner, run_dag


@task
def ok() -> str:
    return "ok"


@task(retries=0)
def bad() -> None:
    raise ValueError("upstream broke")


@task.branch
def choose() -> str:
    return "ok"


@task(trigger_rule="all_done")
def not_chosen() -> str:
    return "never runs: a branch skips the tasks it did not choose whatever their rule"


def rules_dag(rule: str) -> Any:
    """Four targets with one rule: upstreams (success, failed), (success, skipped), (failed,
    failed) and (skipped, skipped); `after` (all_success) follows the first."""

    @task(trigger_rule=rule)
    def target() -> str:
        return "ran"

    @task
    def after() -> str:
        return "after"

    @dag(dag_id=f"rule_{rule}")
    def the_dag() -> None:
        pick = choose()
        chosen, skipped_a, skipped_b = ok(), not_chosen(), not_chosen()
        pick >> [chosen, skipped_a, skipped_b]
        failing, failing_2 = bad(), bad()
        t_fail, t_skip, t_all_failed, t_all_skipped = target(), target(), target(), target()
        [ok(), failing] >> t_fail
        [chosen, skipped_a] >> t_skip
        [failing, failing_2] >> t_all_failed
        [skipped_a, skipped_b] >> t_all_skipped
        t_fail >> after()

    return the_dag


S, SK, UF = "success", "skipped", "upstream_failed"
# Rule -> states of (t_fail, t_skip, t_all_failed, t_all_skipped).
EXPECTED = {
    "all_success": (UF, SK, UF, SK),
    "all_done": (S, S, S, S),
    "all_failed": (SK, SK, S, SK),
    "one_success": (S, S, UF, SK),
    "one_failed": (S, SK, S, SK),
    "none_failed": (UF, S, UF, S),
    "none_failed_min_one_success": (UF, S, UF, SK),
    "always": (S, S, S, S),
}
TARGETS = ("target", "target__1", "target__2", "target__3")


@pytest.mark.parametrize("rule", sorted(EXPECTED))
def test_each_rule_with_failed_and_skipped_upstreams(db_url: str, rule: str) -> None:
    result = run_dag(rules_dag(rule), database_url=db_url)

    states = result.task_states
    assert (states["choose"], states["ok"], states["bad"], states["bad__1"]) == (
        S,
        S,
        "dead_letter",
        "dead_letter",
    )
    assert (states["not_chosen"], states["not_chosen__1"]) == (SK, SK)
    # The branch chose `ok`: its other downstream tasks were skipped (or ran, by their rule).
    assert tuple(states[t] for t in TARGETS) == EXPECTED[rule]
    assert states["after"] == EXPECTED[rule][0]
    assert result.results["choose"] == ["ok"]
    assert result.state == "failed"  # two dead letters
    ran = {t for t in TARGETS if states[t] == S}
    assert {t for t in TARGETS if result.results.get(t) == "ran"} == ran
    # Nothing that did not run has an attempt.
    attempted = {a.task_id for a in result.attempt_history}
    assert attempted.isdisjoint({t for t in TARGETS if states[t] != S})


@task.branch
def route(kind: str) -> str | list[str]:
    return {"fast": "fast", "both": ["fast", "slow"], "none": []}[kind]


@task
def fast() -> str:
    return "fast"


@task
def slow() -> str:
    return "slow"


@task
def fast_2(value: str) -> str:
    return value + "!"


@task
def slow_2(value: str) -> str:
    return value + "!"


@task
def join(a: str | None, b: str | None) -> list[str | None]:
    return [a, b]


@task(trigger_rule="none_failed_min_one_success")
def merge(a: str | None, b: str | None) -> list[str | None]:
    return [a, b]


def branch_dag(kind: str) -> Any:
    @dag(dag_id=f"branch_{kind}")
    def branches() -> None:
        pick = route(kind)
        left, right = fast(), slow()
        pick >> [left, right]
        a, b = fast_2(left), slow_2(right)
        join(a, b)
        merge(a, b)

    return branches


def test_a_branch_skips_the_path_it_did_not_choose_and_the_run_succeeds(db_url: str) -> None:
    result = run_dag(branch_dag("fast"), database_url=db_url)

    assert result.task_states == {
        "route": "success",
        "fast": "success",
        "fast_2": "success",
        "slow": "skipped",
        "slow_2": "skipped",
        "join": "skipped",  # all_success with a skipped upstream: the skip propagates
        "merge": "success",  # none_failed_min_one_success lets the skip through
    }
    assert result.results["route"] == ["fast"]
    assert result.results["merge"] == ["fast!", None]
    # Every leaf that did not run was skipped by rule, nothing failed: the run succeeds.
    assert result.state == "success"


def test_a_branch_may_choose_several_tasks_or_none(db_url: str) -> None:
    both = run_dag(branch_dag("both"), database_url=db_url)
    assert both.state == "success"
    assert both.results["join"] == ["fast!", "slow!"] and both.results["route"] == ["fast", "slow"]

    none = run_dag(branch_dag("none"), database_url=db_url)
    assert none.state == "success"
    assert none.results["route"] == []
    assert {t: s for t, s in none.task_states.items() if t != "route"} == dict.fromkeys(
        ["fast", "slow", "fast_2", "slow_2", "join", "merge"], "skipped"
    )


@task.branch(retries=3, retry_delay=0)
def wrong_branch() -> str:
    return "elsewhere"


def test_a_branch_naming_a_task_it_does_not_lead_to_fails_without_retries(db_url: str) -> None:
    @dag(dag_id="wrong_branch")
    def wrong() -> None:
        wrong_branch() >> [fast(), slow()]

    result = run_dag(wrong, database_url=db_url)

    assert result.task_states == {"wrong_branch": "dead_letter", "fast": UF, "slow": UF}
    (attempt,) = result.attempts("wrong_branch")
    assert attempt.error_type == "InvalidBranch"
    assert attempt.error_message == (
        "branch task 'wrong_branch' chose 'elsewhere', which is not among its direct downstream "
        "tasks; allowed: fast, slow"
    )
    assert result.state == "failed"


def make_requeue_dag(flag: Path) -> Any:
    @task(retries=0)
    def fragile() -> str:
        if not flag.exists():
            raise ValueError(f"missing {flag}")
        return "fixed"

    @task(trigger_rule="one_failed")
    def on_failure() -> str:
        return "alerted"

    @task(trigger_rule="none_failed")
    def guarded(value: str | None) -> str:
        return f"guarded {value}"

    @task
    def last(value: str) -> str:
        return value + "."

    @task(trigger_rule="all_done")
    def cleanup() -> str:
        return "cleaned"

    @dag(dag_id="requeue_rules")
    def requeue_rules() -> None:
        f = fragile()
        f >> on_failure()
        last(guarded(f))
        [f, ok()] >> cleanup()

    return requeue_rules


def _counters(runner: DagRunner, run_id: str, task_id: str) -> tuple[int, int, int, int]:
    ti = task_instances
    with runner.db.read() as conn:
        row = conn.execute(
            sa.select(
                ti.c.upstream_done, ti.c.upstream_failures, ti.c.upstream_skips, ti.c.upstream_total
            ).where(ti.c.run_id == run_id, ti.c.task_id == task_id)
        ).one()
    return tuple(row)  # type: ignore[return-value]


def test_requeue_reopens_what_the_failure_decided_and_recounts_it(db_url: str, tmp_path: Path) -> None:
    flag = tmp_path / "input"
    runner = DagRunner(make_requeue_dag(flag), database_url=db_url)
    try:
        run_id = runner.trigger()
        failed = runner.run_until_done(run_id)
        assert failed.state == "failed"
        assert failed.task_states == {
            "fragile": "dead_letter",
            "on_failure": S,
            "guarded": UF,
            "last": UF,
            "ok": S,
            "cleanup": S,
        }
        assert _counters(runner, run_id, "guarded") == (0, 1, 0, 1)

        flag.write_text("ok")
        (letter,) = dead_letters.list_dead_letters(runner.db)
        dead_letters.requeue_dead_letter(runner.db, letter.task_instance.id)
        reopened = runner.result(run_id)
        assert reopened.state == "running"
        # Rows that failed because of it wait again, their count of its failure taken back;
        # tasks that already ran by their rule keep their outcome.
        assert (reopened.task_states["guarded"], reopened.task_states["last"]) == ("pending", "pending")
        assert _counters(runner, run_id, "guarded") == (0, 0, 0, 1)
        assert reopened.task_states["on_failure"] == S and reopened.task_states["cleanup"] == S

        fixed = runner.run_until_done(run_id)
        assert fixed.state == "success"
        assert fixed.results["last"] == "guarded fixed."
    finally:
        runner.close()


def test_clear_applies_rules_and_branch_choices_again(db_url: str) -> None:
    runner = DagRunner(branch_dag("fast"), database_url=db_url)
    try:
        run_id = runner.trigger()
        assert runner.run_until_done(run_id).state == "success"
        # A task the branch did not choose cannot be cleared alone: it could never run.
        with pytest.raises(
            InvalidRequest, match=r"'slow' could never run: its upstream route \(a branch that chose other"
        ):
            clear_tasks(runner.db, run_id, ["slow"], downstream=False, actor="op", reason="test")
        # Clearing the branch with its downstream runs it again and skips the same path.
        report = clear_tasks(runner.db, run_id, ["route"], downstream=True, actor="op", reason="test")
        assert report.cleared == ["route", "fast", "slow", "fast_2", "slow_2", "join", "merge"]
        cleared = runner.result(run_id)
        assert cleared.task_states["route"] == "queued" and cleared.task_states["slow"] == "pending"
        again = runner.run_until_done(run_id)
        assert again.state == "success"
        assert again.task_states["slow_2"] == "skipped" and again.task_states["merge"] == "success"
        # Clearing `merge` alone: its rule is met by the upstreams as they stand, so it is queued.
        clear_tasks(runner.db, run_id, ["merge"], downstream=False, actor="op", reason="test")
        assert runner.result(run_id).task_states["merge"] == "queued"
        assert runner.run_until_done(run_id).results["merge"] == ["fast!", None]
    finally:
        runner.close()


@task
def slow_load() -> str:
    return "loaded"


@task(trigger_rule="all_done")
def clean_up() -> str:
    return "cleaned"


@task(trigger_rule="none_failed")
def report() -> str:
    return "reported"


@dag(dag_id="cancel_rules")
def cancel_rules() -> None:
    loaded = slow_load()
    loaded >> [clean_up(), report()]
    publish = ok()
    loaded >> publish


def test_cancelling_a_task_lets_the_downstream_rules_decide(db_url: str) -> None:
    from treadle.engine.cancellation import cancel_task

    runner = DagRunner(cancel_rules, database_url=db_url)
    try:
        run_id = runner.trigger()
        cancelled = cancel_task(runner.db, run_id, "slow_load", actor="op", reason="wrong input")
        assert cancelled.cancelled == ("slow_load",)
        # all_success and none_failed downstream end upstream_failed; the all_done clean-up runs.
        assert cancelled.ruled_out == ("ok", "report")
        result = runner.run_until_done(run_id)
        assert result.task_states == {
            "slow_load": "cancelled",
            "clean_up": "success",
            "report": "upstream_failed",
            "ok": "upstream_failed",
        }
        assert result.state == "failed"
        with pytest.raises(InvalidRequest, match="already finished"):
            cancel_task(runner.db, run_id, "slow_load", actor="op")
    finally:
        runner.close()
