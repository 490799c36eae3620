"""The exit-code contract: each class of ending reaches its outcome, with the exit code and the
code version recorded; needs_inspection is never retried, holds its run open, and each
resolution works and is audited."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from treadle import ExitContract, NonRetryable, Retryable, UnknownCommit, dag, task
from treadle.domain.exit_codes import Disposition
from treadle.engine.diagnosis import why
from treadle.errors import DagDefinitionError, InvalidRequest
from treadle.store.database import Database
from treadle.store.tables import audit_log
from treadle.testing import DagRunner, run_dag

THIS_FILE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


@task(retries=1, retry_delay=0)
def source_not_ready() -> None:
    raise Retryable("source not ready", exit_code=20)


@task(retries=3, retry_delay=0)
def misconfigured() -> None:
    raise NonRetryable("no target table configured", exit_code=10)


@task(retries=3, retry_delay=0)
def plain_error() -> None:
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("fn", "states", "outcomes", "codes", "reason"),
    [
        (source_not_ready, "dead_letter", ["failed", "failed"], [20, 20], "retries_exhausted"),
        (misconfigured, "dead_letter", ["failed"], [10], "non_retryable"),
        (plain_error, "dead_letter", ["failed"] * 4, [1] * 4, "retries_exhausted"),
    ],
)
def test_python_exceptions_follow_the_contract(
    db_url: str, fn: Any, states: str, outcomes: list[str], codes: list[int], reason: str
) -> None:
    @dag(dag_id="exceptions")
    def exceptions() -> None:
        fn()

    runner = DagRunner(exceptions, database_url=db_url)
    try:
        result = runner.run_until_done(runner.trigger())
        assert result.task_states == {fn.__name__: states}
        assert [a.outcome for a in result.attempt_history] == outcomes
        assert [a.exit_code for a in result.attempt_history] == codes
        assert {a.code_version for a in result.attempt_history} == {THIS_FILE_HASH}
        [ti] = _instances(runner, result.run.run_id)
        assert ti.dead_letter_reason == reason
    finally:
        runner.close()


@task(exit_codes="standard", retries=2, retry_delay=0)
def exits(code: int) -> None:
    sys.exit(code)


@pytest.mark.parametrize(
    ("code", "state", "attempts"),
    [
        (0, "success", 1),
        (20, "dead_letter", 3),  # retryable: the budget of 2 retries is spent
        (30, "dead_letter", 1),  # non-retryable: at once
        (99, "dead_letter", 3),  # not listed: the default (retryable)
        (60, "needs_inspection", 1),  # unknown commit: never retried
    ],
)
def test_sys_exit_is_classified_by_the_task_contract(
    db_url: str, code: int, state: str, attempts: int
) -> None:
    @dag(dag_id="exits_dag")
    def exits_dag() -> None:
        exits(code)

    runner = DagRunner(exits_dag, database_url=db_url)
    try:
        result = runner.run_until_done(runner.trigger())
        assert result.task_states == {"exits": state}
        assert [a.exit_code for a in result.attempt_history] == [code] * attempts
        if state == "needs_inspection":
            assert [a.outcome for a in result.attempt_history] == ["unknown_commit"]
            assert result.state == "running"  # held open
    finally:
        runner.close()


@task(retries=5, retry_delay=0)
def commit_half(marker: str) -> str:
    path = Path(marker)
    if not path.exists():
        path.write_text("half")
        raise UnknownCommit("the commit timed out; the output may be partly written")
    return "written"


@task
def publish(value: Any) -> str:
    return f"published {value}"


def _pipeline(marker: str) -> Any:
    @dag(dag_id="inspect_me")
    def inspect_me() -> None:
        publish(commit_half(marker))

    return inspect_me


def _instances(runner: DagRunner, run_id: str) -> list[Any]:
    from treadle.engine import queries

    return queries.run_detail(runner.db, run_id).task_instances


def _audit(db: Database) -> list[Any]:
    with db.engine.connect() as conn:
        return list(conn.execute(sa.select(audit_log).where(audit_log.c.action == "task.resolve")))


def test_unknown_commit_waits_for_an_operator_and_blocks_the_downstream(db_url: str, tmp_path: Path) -> None:
    runner = DagRunner(_pipeline(str(tmp_path / "marker")), database_url=db_url)
    try:
        run_id = runner.trigger()
        result = runner.run_until_done(run_id)
        assert result.task_states == {"commit_half": "needs_inspection", "publish": "pending"}
        assert [a.outcome for a in result.attempt_history] == ["unknown_commit"]
        assert result.attempt_history[0].exit_code == 60
        assert result.state == "running"
        # It stays there: more passes neither retry it nor close the run.
        again = runner.run_until_done(run_id)
        assert len(again.attempt_history) == 1 and again.state == "running"
        [reason] = [w.reason for w in why(runner.db, run_id, "commit_half", worker_stale_s=30)]
        assert "needs inspection" in reason and "treadle tasks resolve" in reason
        [pending] = [w.reason for w in why(runner.db, run_id, "publish", worker_stale_s=30)]
        assert "commit_half (needs_inspection)" in pending
    finally:
        runner.close()


def test_resolve_as_success_lets_the_downstream_run(db_url: str, tmp_path: Path) -> None:
    runner = DagRunner(_pipeline(str(tmp_path / "marker")), database_url=db_url)
    try:
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        with pytest.raises(InvalidRequest, match="reason is required"):
            runner.resolve(run_id, "commit_half", as_="success", reason="  ")
        runner.resolve(run_id, "commit_half", as_="success", reason="checked: all 10 partitions present")
        result = runner.run_until_done(run_id)
        assert result.state == "success"
        assert result.task_states == {"commit_half": "success", "publish": "success"}
        assert result.results["publish"] == "published None"
        [entry] = _audit(runner.db)
        assert entry.target == f"{run_id}/commit_half"
        assert entry.details["as"] == "success" and "partitions" in entry.details["reason"]
        with pytest.raises(InvalidRequest, match="not needs_inspection"):
            runner.resolve(run_id, "commit_half", as_="failed", reason="again")
    finally:
        runner.close()


def test_resolve_as_failed_dead_letters_it_and_fails_the_run(db_url: str, tmp_path: Path) -> None:
    runner = DagRunner(_pipeline(str(tmp_path / "marker")), database_url=db_url)
    try:
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        runner.resolve(run_id, "commit_half", as_="failed", reason="output corrupt")
        result = runner.run_until_done(run_id)
        assert result.state == "failed"
        assert result.task_states == {"commit_half": "dead_letter", "publish": "upstream_failed"}
        [ti] = [t for t in _instances(runner, run_id) if t.task_id == "commit_half"]
        assert ti.dead_letter_reason == "resolved_failed"
    finally:
        runner.close()


def test_resolve_as_requeue_runs_it_again_with_a_fresh_budget(db_url: str, tmp_path: Path) -> None:
    runner = DagRunner(_pipeline(str(tmp_path / "marker")), database_url=db_url)
    try:
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        runner.resolve(run_id, "commit_half", as_="requeue", reason="rolled the partial output back")
        result = runner.run_until_done(run_id)
        assert result.state == "success"
        assert [a.outcome for a in result.attempts("commit_half")] == ["unknown_commit", "success"]
        assert result.results["publish"] == "published written"
        assert [e.details["as"] for e in _audit(runner.db)] == ["requeue"]
    finally:
        runner.close()


def test_run_dag_returns_when_only_an_operator_can_move_the_run(tmp_path: Path) -> None:
    result = run_dag(_pipeline(str(tmp_path / "marker")))
    assert result.task_states["commit_half"] == "needs_inspection"


def test_exit_contracts_validate_and_classify() -> None:
    standard = ExitContract.standard()
    assert [standard.classify(c) for c in (0, 20, 50, 10, 30, 40, 70, 60, 3)] == [
        Disposition.SUCCESS,
        Disposition.RETRYABLE,
        Disposition.RETRYABLE,
        *[Disposition.NON_RETRYABLE] * 4,
        Disposition.UNKNOWN_COMMIT,
        Disposition.RETRYABLE,
    ]
    assert ExitContract().classify(1) is Disposition.RETRYABLE and ExitContract().is_default
    strict = ExitContract.of(success=[0, 3], non_retryable=[2], default="non_retryable")
    assert strict.classify(3) is Disposition.SUCCESS and strict.classify(9) is Disposition.NON_RETRYABLE
    assert ExitContract.from_json(strict.to_json()) == strict
    with pytest.raises(ValueError, match="both success and retryable"):
        ExitContract.of(retryable=[0])
    with pytest.raises(ValueError, match=r"0\.\.255"):
        ExitContract.of(unknown_commit=[300])
    with pytest.raises(ValueError, match="default must be one of"):
        ExitContract.of(default="maybe")
    with pytest.raises(ValueError, match=r"1\.\.255"):
        Retryable("x", exit_code=0)


def test_bad_exit_codes_setting_is_a_definition_error() -> None:
    with pytest.raises(DagDefinitionError, match="unknown key"):

        @task(exit_codes={"sucess": [0]})
        def typo() -> None: ...

        @dag(dag_id="typo_dag")
        def typo_dag() -> None:
            typo()

    with pytest.raises(DagDefinitionError, match="exit_codes must be"):

        @task(exit_codes=60)
        def wrong() -> None: ...

        @dag(dag_id="wrong_dag")
        def wrong_dag() -> None:
            wrong()


def test_a_contract_changes_the_version_hash_only_when_set() -> None:
    @task
    def plain() -> None: ...

    @dag(dag_id="hash_dag")
    def hash_dag() -> None:
        plain()

    data = hash_dag.structure().to_json()
    assert "exit_contract" not in data["tasks"]["plain"]

    @task(exit_codes="standard")
    def plain2() -> None: ...

    @dag(dag_id="hash_dag2")
    def hash_dag2() -> None:
        plain2()

    assert hash_dag2.structure().to_json()["tasks"]["plain2"]["exit_contract"]["unknown_commit"] == [60]


def test_a_waiting_inspection_can_be_cancelled_but_not_cleared(db_url: str, tmp_path: Path) -> None:
    from treadle.engine.cancellation import cancel_run
    from treadle.engine.clearing import clear_tasks

    runner = DagRunner(_pipeline(str(tmp_path / "marker")), database_url=db_url)
    try:
        run_id = runner.trigger()
        runner.run_until_done(run_id)
        with pytest.raises(InvalidRequest, match="tasks resolve"):
            clear_tasks(runner.db, run_id, ["commit_half"], downstream=False, actor="t", reason="")
        cancel_run(runner.db, run_id, actor="cli:test", reason="abandon the day")
        result = runner.result(run_id)
        assert result.state == "cancelled"
        assert result.task_states == {"commit_half": "cancelled", "publish": "cancelled"}
    finally:
        runner.close()
