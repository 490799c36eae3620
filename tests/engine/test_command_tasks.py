"""Command tasks through the engine (DagRunner: real programs, real databases): exit codes under
the contract, results and outputs from the output folder, logs, stand-ins from treadle.testing,
and the definition rules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from treadle import CommandTask, dag, task
from treadle.domain.commands import MAX_OUTPUT_FILE_BYTES
from treadle.domain.dag_version import DagStructure, TaskDef
from treadle.errors import DagDefinitionError
from treadle.testing import DagRunner, exit_with, run_dag

PY = sys.executable


def _snapshot_dag(**settings: Any) -> Any:
    @dag(dag_id="snapshots")
    def snapshots() -> None:
        CommandTask(task_id="snapshot", argv=["/opt/jobs/bin/snapshot", "--full"], **settings)

    return snapshots


@pytest.mark.parametrize(
    ("code", "state", "outcomes"),
    [
        (0, "success", ["success"]),
        (20, "dead_letter", ["failed", "failed"]),  # retryable: the one retry is spent
        (30, "dead_letter", ["failed"]),  # non-retryable: at once
        (60, "needs_inspection", ["unknown_commit"]),
    ],
)
def test_a_stand_in_exit_code_is_classified_by_the_contract(
    db_url: str, code: int, state: str, outcomes: list[str]
) -> None:
    stand_in = exit_with(code, stdout="rows: 3\n", stderr="warehouse said no\n", result={"rows": 3})
    runner = DagRunner(
        _snapshot_dag(exit_codes="standard", retries=1, retry_delay=0),
        database_url=db_url,
        commands={"snapshot": stand_in},
    )
    try:
        result = runner.run_until_done(runner.trigger())
        assert result.task_states == {"snapshot": state}
        assert [a.outcome for a in result.attempt_history] == outcomes
        assert {a.exit_code for a in result.attempt_history} == {code}
        assert "rows: 3" in runner.log(result.run.run_id, "snapshot")
        if code == 0:
            assert result.results["snapshot"] == {"rows": 3}
        else:
            last = result.attempt_history[-1]
            assert last.error_type == "CommandFailed"
            assert f"exited with code {code}" in (last.error_message or "")
            assert "warehouse said no" in (last.error_message or "")  # the stderr tail
    finally:
        runner.close()


def test_outputs_are_stored_with_the_attempt_and_bounded(db_url: str) -> None:
    big = {"pad": "x" * MAX_OUTPUT_FILE_BYTES}
    stand_in = exit_with(0, outputs={"metrics": {"rows_written": 3}, "lineage": big, "other": {"ignored": 1}})
    result = run_dag(_snapshot_dag(), database_url=db_url, commands={"snapshot": stand_in})
    assert result.state == "success"
    [attempt] = result.attempt_history
    assert attempt.outputs is not None
    assert attempt.outputs["metrics"] == {"rows_written": 3}
    assert "the limit is 65536" in attempt.outputs["lineage"]["error"]
    assert set(attempt.outputs) == {"metrics", "lineage"}
    assert result.results.get("snapshot") is None  # no run-output.json


def test_a_result_over_the_limit_fails_without_retries(db_url: str) -> None:
    stand_in = exit_with(0, result={"pad": "x" * 2000})
    result = run_dag(
        _snapshot_dag(retries=3), database_url=db_url, commands={"snapshot": stand_in}, max_result_bytes=1000
    )
    assert result.task_states == {"snapshot": "dead_letter"}
    [attempt] = result.attempt_history
    assert attempt.error_type == "ResultTooLarge" and "the limit is 1000" in (attempt.error_message or "")


@task
def partition() -> str:
    return "2026-07-04"


@task.command(exit_codes="standard")
def extract(day: str, context: Any) -> list[str]:
    code = "import os, sys; print('extracting', sys.argv[1], os.environ['TREADLE_TASK_ID']); sys.exit(0)"
    return [PY, "-c", code, day, context.run_id]


@task.command(shell=True, retries=0)
def shell_step(day: str) -> str:
    return f"echo shell sees $TREADLE_DAG_ID {day}; exit 3"


def test_task_command_gets_upstream_values_and_runs_what_it_returns(db_url: str) -> None:
    @dag(dag_id="extracts")
    def extracts() -> None:
        day = partition()
        extract(day)
        shell_step(day)

    runner = DagRunner(extracts, database_url=db_url)
    try:
        result = runner.run_until_done(runner.trigger())
        run_id = result.run.run_id
        assert result.task_states == {
            "partition": "success",
            "extract": "success",
            "shell_step": "dead_letter",
        }
        assert runner.log(run_id, "extract").strip() == "extracting 2026-07-04 extract"
        assert "shell sees extracts 2026-07-04" in runner.log(run_id, "shell_step")
        [failed] = result.attempts("shell_step")
        assert (failed.outcome, failed.exit_code) == ("failed", 3)
    finally:
        runner.close()


def test_the_manifest_is_passed_as_an_argument_unless_opted_out(tmp_path: Path) -> None:
    script = (
        "import json, os, sys; "
        "print(json.dumps({'argv': sys.argv[1:], 'env': os.environ['TREADLE_MANIFEST_FILE']}))"
    )

    @dag(dag_id="manifests")
    def manifests() -> None:
        CommandTask(task_id="with_arg", argv=[PY, "-c", script, "x"])
        CommandTask(task_id="without", argv=[PY, "-c", script, "x"], manifest_arg=False)

    runner = DagRunner(manifests)
    try:
        result = runner.run_until_done(runner.trigger({"day": "2026-07-04"}))
        run_id = result.run.run_id
        with_arg = json.loads(runner.log(run_id, "with_arg"))
        without = json.loads(runner.log(run_id, "without"))
        assert with_arg["argv"] == ["x", "--run-manifest", with_arg["env"]]
        assert without["argv"] == ["x"]
        manifest = json.loads(Path(with_arg["env"]).read_text())
        assert manifest["run_id"] == run_id
        assert Path(with_arg["env"]).name == "manifest.json"
    finally:
        runner.close()


def test_a_program_that_is_not_there_fails_without_retries() -> None:
    result = run_dag(_snapshot_dag(retries=3))
    [attempt] = result.attempt_history
    assert result.task_states == {"snapshot": "dead_letter"}
    assert attempt.error_type == "CommandNotFound" and attempt.exit_code == 127
    assert "/opt/jobs/bin/snapshot" in (attempt.error_message or "")


def test_definition_errors_name_the_problem() -> None:
    with pytest.raises(DagDefinitionError, match="inside a @dag"):
        CommandTask(task_id="x", argv=["true"])

    def build(**kwargs: Any) -> None:
        @dag(dag_id="bad")
        def bad() -> None:
            CommandTask(task_id="x", **kwargs)

    with pytest.raises(DagDefinitionError, match="needs shell=True"):
        build(argv="echo hi")
    with pytest.raises(DagDefinitionError, match="one non-empty string"):
        build(argv=["echo", "hi"], shell=True)
    with pytest.raises(DagDefinitionError, match="env must be a mapping of strings"):
        build(argv=["true"], env={"N": 1})
    with pytest.raises(DagDefinitionError, match="unknown setting"):
        build(argv=["true"], retires=3)
    with pytest.raises(DagDefinitionError, match="allowed must be a list"):
        build(argv=["true"], allowed="java")
    with pytest.raises(ValueError, match="not a command task"):
        DagRunner(_snapshot_dag(), commands={"nope": ["true"]})


def test_the_command_is_part_of_the_version_and_old_json_still_reads() -> None:
    first = _snapshot_dag().structure()
    edited = _snapshot_dag(env={"MODE": "nightly"}).structure()
    assert first.content_hash() != edited.content_hash()
    stored = first.tasks["snapshot"].to_json()
    assert stored["command"]["argv"] == ["/opt/jobs/bin/snapshot", "--full"]
    assert DagStructure.from_json(first.to_json()).content_hash() == first.content_hash()
    assert "MODE" in json.dumps(edited.to_json()) and "nightly" not in json.dumps(
        edited.tasks["snapshot"].to_json()
    )
    # A Python task writes no command key, so the hash of existing DAGs is unchanged.
    python_task = TaskDef(task_id="t")
    assert "command" not in python_task.to_json()
    assert TaskDef.from_json(python_task.to_json()).command is None


def test_a_relative_program_runs_from_cwd_and_a_stand_in_replaces_a_shell_command(tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text('#!/bin/sh\necho "{\\"cwd\\": \\"$(pwd)\\"}" > "$TREADLE_OUTPUT_DIR/run-output.json"\n')
    job.chmod(0o755)

    @dag(dag_id="relative")
    def relative() -> None:
        CommandTask(task_id="local", argv=["./job.sh"], cwd=tmp_path, manifest_arg=False)
        CommandTask(task_id="shelly", argv="exit 9", shell=True)

    result = run_dag(relative, commands={"shelly": exit_with(0, result="stood in")})
    assert result.state == "success"
    assert result.results == {"local": {"cwd": str(tmp_path)}, "shelly": "stood in"}
