"""Run a whole DAG in-process against a temporary SQLite database, from a pytest test.

    result = run_dag(my_dag, conf={"day": "2026-07-04"})
    assert result.state == "success"
    assert result.results["load"] == {"rows": 3}
    assert [e.dataset for e in result.dataset_events] == ["warehouse.sales_daily"]

Tasks run in the calling process through the same engine as production (claim, fenced
completion, retry policy, dead letters, dataset events of outlets); retry delays are honoured,
task timeouts are not. Runs are manual, so a DAG whose contract sets `manual_runs=False` is
refused as it would be by `treadle dags trigger`; `run_type="scheduled"` runs it as its schedule
would (with the params' defaults).

Command tasks run their program (in a child process, its output in a per-attempt log under the
runner's folder); `commands=` swaps a task's program for a stand-in, and `exit_with` builds one
that exits with a chosen code:

    runner = DagRunner(my_dag, commands={"snapshot": exit_with(60, stderr="commit timed out")})
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from treadle.authoring.specs import Dag
from treadle.domain.commands import attempt_log_path
from treadle.domain.mapping import DEFAULT_MAX_MAP_LENGTH, instance_label
from treadle.domain.records import RunInfo
from treadle.domain.states import TERMINAL_RUN_STATES, AttemptOutcome, RunType, TaskState
from treadle.domain.task_records import AttemptError, AttemptInfo, ClaimedTask
from treadle.engine import inspection, queries
from treadle.engine.dags import sync_dags
from treadle.engine.datasets import parse_outlet_events, run_dataset_events
from treadle.engine.execution import claim_task_instances, complete_attempt, fail_attempt
from treadle.engine.reaper import promote_due_retries
from treadle.engine.runs import finish_idle_runs, trigger_run
from treadle.engine.sensing import reschedule_attempt, time_out_sensor
from treadle.errors import InvalidRequest
from treadle.store import migrate
from treadle.store.database import Database
from treadle.store.datasets import DatasetEventInfo
from treadle.worker.attempt_log import AttemptFiles, AttemptLog
from treadle.worker.child import call_callback, call_task
from treadle.worker.poking import job_ended, poke_answer, poke_evidence, poke_request
from treadle.worker.protocol import run_message, to_attempt_details, to_attempt_error

__all__ = ["DagRunResult", "DagRunner", "exit_with", "run_dag"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DagRunResult:
    """What an in-process run ended with."""

    run: RunInfo
    #: State by task id; a mapped task's instances appear as `task[0]`, `task[1]`... once it
    #: expanded (before that, or when it maps over nothing, as `task`).
    task_states: dict[str, str]
    #: Result by task id; a mapped task's is the list of its instances' results.
    results: dict[str, Any]  # Any: user JSON
    attempt_history: list[AttemptInfo]
    database_url: str
    #: Events the run's tasks recorded on their outlets, oldest first.
    dataset_events: list[DatasetEventInfo] = field(default_factory=list)

    @property
    def state(self) -> str:
        """The run's final state."""
        return self.run.state

    def attempts(self, task_id: str) -> list[AttemptInfo]:
        """Every attempt of one task, in order."""
        return [a for a in self.attempt_history if a.task_id == task_id]


class DagRunner:
    """Register one DAG on a database and drive its runs to the end in this process."""

    def __init__(
        self,
        dag: Dag,
        *,
        database_url: str | None = None,
        max_result_bytes: int = 64 * 1024,
        max_map_length: int = DEFAULT_MAX_MAP_LENGTH,
        commands: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        tmp = Path(tempfile.mkdtemp(prefix="treadle-test-"))
        self.dag = dag
        #: Stand-in argv per command task id (its own argv is not run).
        self.commands = _check_commands(dag, commands or {})
        #: Where command tasks' run files and attempt logs go.
        self.files = AttemptFiles(
            logs_dir=tmp / "logs", runs_dir=tmp / "runs", log_max_bytes=64 * 1024 * 1024
        )
        self.database_url = database_url or f"sqlite:///{tmp / 'test.db'}"
        self.max_result_bytes = max_result_bytes
        self.db = Database(
            self.database_url, application_name="treadle-testing", max_map_length=max_map_length
        )
        migrate.upgrade(self.db)
        sync_dags(self.db, structures=[dag.structure()], scanned_files=[], errors={})

    def trigger(self, conf: dict[str, Any] | None = None, *, run_type: str = "manual") -> str:
        """Start a run ("manual", or "scheduled": the params' defaults, no conf); returns its id."""
        if run_type not in (RunType.MANUAL, RunType.SCHEDULED):
            raise InvalidRequest(f"run_type must be 'manual' or 'scheduled', got {run_type!r}")
        if run_type == RunType.SCHEDULED and conf:
            raise InvalidRequest("a scheduled run takes the params' defaults: pass no conf")
        return trigger_run(
            self.db, self.dag.dag_id, conf=conf, triggered_by="treadle.testing", run_type=RunType(run_type)
        ).run_id

    def run_until_done(self, run_id: str, *, timeout_s: float = 60.0) -> DagRunResult:
        """Execute ready tasks (waiting out retry delays) until the run is terminal, or waits on
        an operator (a task in needs_inspection, nothing else left to do: resolve it with
        `resolve` and call this again)."""
        deadline = time.monotonic() + timeout_s
        while not self._step(run_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} did not finish within {timeout_s} s")
        return self.result(run_id)

    def result(self, run_id: str) -> DagRunResult:
        """The run as recorded now."""
        detail = queries.run_detail(self.db, run_id)
        return DagRunResult(
            run=detail.run,
            task_states={
                instance_label(t.task_id, t.map_index): t.state
                for t in detail.task_instances
                if t.map_index >= -1
            },
            results=detail.results,
            attempt_history=detail.attempts,
            database_url=self.database_url,
            dataset_events=run_dataset_events(self.db, run_id),
        )

    def resolve(self, run_id: str, task_id: str, *, as_: str, reason: str, map_index: int = -1) -> None:
        """Resolve a task that needs inspection: `as_` is success, failed or requeue."""
        inspection.resolve(
            self.db,
            run_id,
            task_id,
            resolution=inspection.Resolution(as_),
            reason=reason,
            actor="treadle.testing",
            map_index=map_index,
        )

    def log(self, run_id: str, task_id: str, *, attempt: int = 1) -> str:
        """What a command task's program wrote (stdout and stderr) in one attempt ("" if none)."""
        path = attempt_log_path(
            self.files.logs_dir,
            dag_id=self.dag.dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=-1,
            attempt=attempt,
        )
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Release the database connections."""
        self.db.dispose()

    def _step(self, run_id: str) -> bool:
        promote_due_retries(self.db)
        claimed = claim_task_instances(
            self.db,
            worker_id="treadle-testing",
            hostname="local",
            queues=_queues(self.dag),
            limit=16,
            lease_s=3600,
        )
        for task in claimed:
            extra: dict[str, Any] = self.files.message_fields(task)
            if task.task_id in self.commands:
                extra["command_argv"] = self.commands[task.task_id]
            _execute(self.db, self.dag, task, self.max_result_bytes, extra)
        finish_idle_runs(self.db)
        detail = queries.run_detail(self.db, run_id)
        if detail.run.state in TERMINAL_RUN_STATES:
            return True
        states = {t.state for t in detail.task_instances}
        if TaskState.NEEDS_INSPECTION.value in states and not states & _MOVING:
            return True  # only an operator can move it on
        if not claimed:
            time.sleep(0.02)
        return False


def run_dag(
    dag: Dag,
    *,
    conf: dict[str, Any] | None = None,
    database_url: str | None = None,
    timeout_s: float = 60.0,
    max_result_bytes: int = 64 * 1024,
    run_type: str = "manual",
    commands: Mapping[str, Sequence[str]] | None = None,
) -> DagRunResult:
    """Register `dag`, trigger a run and execute it to the end in this process.

    Uses a fresh SQLite file in a temporary folder unless `database_url` is given. `run_type`
    "scheduled" runs the DAG as its schedule would (params' defaults, no conf). `commands` swaps
    command tasks' programs for stand-ins (see `exit_with`).
    Raises TimeoutError if the run is not finished after `timeout_s`.
    """
    runner = DagRunner(dag, database_url=database_url, max_result_bytes=max_result_bytes, commands=commands)
    try:
        return runner.run_until_done(runner.trigger(conf, run_type=run_type), timeout_s=timeout_s)
    finally:
        runner.close()


#: States that move on without an operator.
_MOVING = {
    TaskState.QUEUED.value,
    TaskState.RUNNING.value,
    TaskState.RETRY_WAIT.value,
    TaskState.UP_FOR_RESCHEDULE.value,
}


def exit_with(
    code: int,
    *,
    stdout: str = "",
    stderr: str = "",
    result: Any = None,
    outputs: Mapping[str, Any] | None = None,
) -> list[str]:
    """The argv of a stand-in program for a command task: it prints `stdout` and `stderr`, writes
    `result` as run-output.json (unless None) and each of `outputs` as NAME.json (e.g. "metrics")
    into TREADLE_OUTPUT_DIR, then exits with `code`. Any: JSON values."""
    if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
        raise ValueError(f"exit code must be an integer in 0..255, got {code!r}")
    files = {f"{name}.json": value for name, value in (outputs or {}).items()}
    if result is not None:
        files["run-output.json"] = result
    script = (
        "import json, os, sys\n"
        f"sys.stdout.write({stdout!r})\n"
        f"sys.stderr.write({stderr!r})\n"
        f"for name, value in json.loads({json.dumps(files)!r}).items():\n"
        "    with open(os.path.join(os.environ['TREADLE_OUTPUT_DIR'], name), 'w') as f:\n"
        "        json.dump(value, f)\n"
        f"sys.exit({code})\n"
    )
    return [sys.executable, "-c", script]


def _check_commands(dag: Dag, commands: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    checked: dict[str, list[str]] = {}
    for task_id, argv in commands.items():
        node = dag.tasks.get(task_id)
        if node is None or node.command is None:
            raise ValueError(f"commands: {task_id!r} is not a command task of DAG {dag.dag_id!r}")
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"commands: the stand-in for {task_id!r} must be a non-empty list of strings")
        checked[task_id] = list(argv)
    return checked


def _queues(dag: Dag) -> list[str]:
    return sorted({t.settings.queue for t in dag.tasks.values()})


def _execute(
    db: Database, dag: Dag, task: ClaimedTask, max_result_bytes: int, extra: Mapping[str, Any]
) -> None:
    version = db.version_cache[task.dag_version_id]
    message = run_message(task, version) | dict(extra)
    definition = version.structure.tasks[task.task_id]
    if definition.sensor is not None:  # a poke: it starts from what the last one left
        message = poke_request(db, task, message)
    log = AttemptLog(Path(message["log_path"]), max_bytes=int(message["log_max_bytes"]))
    try:
        reply = call_task(
            dag,
            message,
            max_result_bytes=max_result_bytes,
            user_roots=(str(Path(dag.fileloc).parent),),
            log=log,
        )
    finally:
        log.close()
    if definition.sensor is not None:
        kind, reply = poke_answer(reply)
        if kind == "wait":
            first = (message.get("poke") or {}).get("first_poke_at")
            reschedule_attempt(
                db,
                task,
                worker_id="treadle-testing",
                hostname="local",
                state=reply.get("state"),
                evidence=poke_evidence(reply),
                first_poke_at=datetime.fromisoformat(first) if first else None,
            )
            return
        if kind == "timeout":
            time_out_sensor(
                db, task, worker_id="treadle-testing", hostname="local", evidence=poke_evidence(reply)
            )
            return
    if reply.get("ok"):
        try:
            annotations = parse_outlet_events(reply.get("outlet_events"))
        except ValueError as exc:
            error = AttemptError(error_type="OutletEventInvalid", message=str(exc), retryable=False)
        else:
            complete_attempt(
                db,
                task,
                worker_id="treadle-testing",
                hostname="local",
                value=reply.get("value"),
                outlet_events=annotations,
                details=to_attempt_details(reply),
            )
            return
    else:
        error = to_attempt_error(reply)
    outcome = AttemptOutcome.UNKNOWN_COMMIT if error.unknown_commit else AttemptOutcome.FAILED
    ending = fail_attempt(
        db,
        task,
        outcome=outcome,
        error=error,
        worker_id="treadle-testing",
        hostname="local",
        forget_poll_state=job_ended(definition, error),
    )
    if ending.applied and ending.decision is not None:
        name = "on_retry" if ending.decision.retry else "on_dead_letter"
        call_callback(
            dag,
            message | {"callback": name, "error": {"error_type": error.error_type, "message": error.message}},
        )
