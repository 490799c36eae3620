"""Run a whole DAG in-process against a temporary SQLite database, from a pytest test.

    result = run_dag(my_dag, conf={"day": "2026-07-04"})
    assert result.state == "success"
    assert result.results["load"] == {"rows": 3}
    assert [e.dataset for e in result.dataset_events] == ["warehouse.sales_daily"]

Tasks run in the calling process through the same engine as production (claim, fenced
completion, retry policy, dead letters, dataset events of outlets); retry delays are honoured,
task timeouts are not.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from treadle.authoring.specs import Dag
from treadle.domain.records import AttemptError, AttemptInfo, ClaimedTask, RunInfo
from treadle.domain.states import TERMINAL_RUN_STATES, AttemptOutcome, TaskState
from treadle.engine import inspection, queries
from treadle.engine.dags import sync_dags
from treadle.engine.datasets import parse_outlet_events, run_dataset_events
from treadle.engine.execution import claim_task_instances, complete_attempt, fail_attempt
from treadle.engine.reaper import promote_due_retries
from treadle.engine.runs import finish_idle_runs, trigger_run
from treadle.engine.sensing import reschedule_attempt, time_out_sensor
from treadle.store import migrate
from treadle.store.database import Database
from treadle.store.datasets import DatasetEventInfo
from treadle.worker.child import call_callback, call_task
from treadle.worker.poking import job_ended, poke_answer, poke_evidence, poke_request
from treadle.worker.protocol import run_message, to_attempt_details, to_attempt_error

__all__ = ["DagRunResult", "DagRunner", "run_dag"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DagRunResult:
    """What an in-process run ended with."""

    run: RunInfo
    task_states: dict[str, str]
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
        self, dag: Dag, *, database_url: str | None = None, max_result_bytes: int = 64 * 1024
    ) -> None:
        tmp = Path(tempfile.mkdtemp(prefix="treadle-test-"))
        self.dag = dag
        self.database_url = database_url or f"sqlite:///{tmp / 'test.db'}"
        self.max_result_bytes = max_result_bytes
        self.db = Database(self.database_url, application_name="treadle-testing")
        migrate.upgrade(self.db)
        sync_dags(self.db, structures=[dag.structure()], scanned_files=[], errors={})

    def trigger(self, conf: dict[str, Any] | None = None) -> str:
        """Start a run; returns its id."""
        return trigger_run(self.db, self.dag.dag_id, conf=conf, triggered_by="treadle.testing").run_id

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
            task_states={t.task_id: t.state for t in detail.task_instances},
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
            _execute(self.db, self.dag, task, self.max_result_bytes)
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
) -> DagRunResult:
    """Register `dag`, trigger a run and execute it to the end in this process.

    Uses a fresh SQLite file in a temporary folder unless `database_url` is given.
    Raises TimeoutError if the run is not finished after `timeout_s`.
    """
    runner = DagRunner(dag, database_url=database_url, max_result_bytes=max_result_bytes)
    try:
        return runner.run_until_done(runner.trigger(conf), timeout_s=timeout_s)
    finally:
        runner.close()


#: States that move on without an operator.
_MOVING = {
    TaskState.QUEUED.value,
    TaskState.RUNNING.value,
    TaskState.RETRY_WAIT.value,
    TaskState.UP_FOR_RESCHEDULE.value,
}


def _queues(dag: Dag) -> list[str]:
    return sorted({t.settings.queue for t in dag.tasks.values()})


def _execute(db: Database, dag: Dag, task: ClaimedTask, max_result_bytes: int) -> None:
    version = db.version_cache[task.dag_version_id]
    message = run_message(task, version)
    definition = version.structure.tasks[task.task_id]
    if definition.sensor is not None:  # a poke: it starts from what the last one left
        message = poke_request(db, task, message)
    reply = call_task(
        dag, message, max_result_bytes=max_result_bytes, user_roots=(str(Path(dag.fileloc).parent),)
    )
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
