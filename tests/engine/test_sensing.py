"""Sensors and submit-then-poll tasks through the engine on every dialect: the reschedule and
promotion transitions, the retry budget and poison accounting, timeouts, fencing, cancellation
of submitted jobs and what `why` says of a waiting sensor."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from treadle import Deferred, PollResult, Waiting, dag, sensor, task
from treadle.authoring.context import TaskContext
from treadle.domain.task_records import ClaimedTask
from treadle.engine.cancellation import cancel_run
from treadle.engine.diagnosis import why
from treadle.engine.execution import Reschedule, claim_task_instances, work_cycle
from treadle.engine.reaper import promote_due_retries, reap_expired_leases
from treadle.engine.sensing import (
    claim_job_cancels,
    finish_job_cancel,
    poke_start,
    reschedule_attempt,
)
from treadle.store import attempts as attempt_store
from treadle.store import job_cancellations as job_store
from treadle.store import task_instances as ti_store
from treadle.store.tables import task_instances as ti_table
from treadle.testing import DagRunner

STATE = Path()  # set per test: the file the sensors and jobs below read


@sensor(poke_interval=0.02, timeout=60)
def counts_to_five(context: TaskContext) -> Any:
    seen = (context.poke.state or {}).get("n", 0) if context.poke else 0
    if seen < 5:
        return Waiting(state={"n": seen + 1}, evidence={"seen": seen})
    return {"pokes": seen}


@task
def downstream(value: Any = None) -> str:
    return "ran"


def _instances(runner: DagRunner, run_id: str) -> dict[str, Any]:
    with runner.db.read() as conn:
        return {t.task_id: t for t in ti_store.list_for_run(conn, run_id)}


def test_pokes_reschedule_without_spending_retries_and_pass_their_state_on(db_url: str) -> None:
    @dag(dag_id="counting")
    def counting() -> None:
        downstream(counts_to_five())

    runner = DagRunner(counting, database_url=db_url)
    try:
        result = runner.run_until_done(runner.trigger())
        assert result.state == "success"
        assert result.results == {"counts_to_five": {"pokes": 5}, "downstream": "ran"}
        pokes = result.attempts("counts_to_five")
        assert [a.outcome for a in pokes] == ["rescheduled"] * 5 + ["success"]
        assert [a.outputs for a in pokes[:5]] == [{"evidence": {"seen": n}} for n in range(5)]
        sensed = _instances(runner, result.run.run_id)["counts_to_five"]
        assert (sensed.attempt, sensed.attempt - sensed.budget_base, sensed.orphaned_count) == (6, 1, 0)
    finally:
        runner.close()


@sensor(poke_interval=0.02, timeout=60, retries=1, retry_delay=0)
def flaky_sensor(context: TaskContext) -> Any:
    assert context.poke is not None
    if context.attempt % 2 == 0:
        raise RuntimeError(f"poke {context.attempt} could not reach the source")
    return Waiting(state=context.attempt)


def test_a_poke_that_raises_is_a_failure_under_the_retry_policy(db_url: str) -> None:
    @dag(dag_id="flaky")
    def flaky() -> None:
        downstream(flaky_sensor())

    runner = DagRunner(flaky, database_url=db_url)
    try:
        result = runner.run_until_done(runner.trigger())
        # Poke 2 fails (the one retry), poke 3 waits again, poke 4 fails: the budget is spent.
        assert [a.outcome for a in result.attempts("flaky_sensor")] == [
            "rescheduled",
            "failed",
            "rescheduled",
            "failed",
        ]
        assert result.task_states == {"flaky_sensor": "dead_letter", "downstream": "upstream_failed"}
        sensed = _instances(runner, result.run.run_id)["flaky_sensor"]
        assert sensed.dead_letter_reason == "retries_exhausted"
    finally:
        runner.close()


@sensor(poke_interval=0.05, timeout=0.4)
def never_true() -> bool:
    return False


@sensor(poke_interval=0.05, timeout=0.4, soft_fail=True)
def never_true_soft() -> bool:
    return False


@pytest.mark.parametrize(
    ("fn", "states", "reason", "run_state"),
    [
        (
            never_true,
            {"never_true": "dead_letter", "downstream": "upstream_failed"},
            "sensor_timeout",
            "failed",
        ),
        (never_true_soft, {"never_true_soft": "skipped", "downstream": "skipped"}, None, "success"),
    ],
)
def test_a_sensor_times_out_from_its_first_poke(
    db_url: str, fn: Any, states: dict[str, str], reason: str | None, run_state: str
) -> None:
    @dag(dag_id="timing_out")
    def timing_out() -> None:
        downstream(fn())

    runner = DagRunner(timing_out, database_url=db_url)
    try:
        result = runner.run_until_done(runner.trigger())
        assert result.task_states == states and result.state == run_state
        attempts = result.attempts(fn.__name__)
        assert len(attempts) >= 2 and {a.outcome for a in attempts[:-1]} == {"rescheduled"}
        assert (attempts[-1].outcome, attempts[-1].error_type) == ("timed_out", "SensorTimeout")
        first_poke = attempts[0].started_at
        assert first_poke is not None
        assert (attempts[-1].ended_at - first_poke).total_seconds() >= 0.4
        sensed = _instances(runner, result.run.run_id)[fn.__name__]
        assert sensed.dead_letter_reason == reason
    finally:
        runner.close()


@sensor(poke_interval=30, timeout=3600)
def slow_sensor() -> bool:
    return False


def _claim(runner: DagRunner) -> ClaimedTask:
    [claimed] = claim_task_instances(
        runner.db, worker_id="w1", hostname="h", queues=["default"], limit=1, lease_s=60
    )
    return claimed


def test_reschedule_is_fenced_and_promotion_queues_the_next_poke(db_url: str) -> None:
    @dag(dag_id="fenced")
    def fenced() -> None:
        slow_sensor()

    runner = DagRunner(fenced, database_url=db_url)
    try:
        run_id = runner.trigger()
        claimed = _claim(runner)
        assert poke_start(runner.db, claimed).state is None
        refused = reschedule_attempt(runner.db, claimed, worker_id="w2", hostname="h", state={"k": 1})
        assert not refused.applied
        assert _instances(runner, run_id)["slow_sensor"].state == "running"
        applied = reschedule_attempt(runner.db, claimed, worker_id="w1", hostname="h", state={"k": 1})
        assert applied.applied
        again = reschedule_attempt(runner.db, claimed, worker_id="w1", hostname="h", state={"k": 2})
        assert not again.applied  # the attempt already ended: a repeat is discarded
        row = _instances(runner, run_id)["slow_sensor"]
        assert row.state == "up_for_reschedule" and row.worker_id is None
        assert row.next_attempt_at is not None and row.started_at is not None
        assert 29 <= (row.next_attempt_at - row.started_at).total_seconds() <= 60
        assert promote_due_retries(runner.db) == 0  # not due for 30 s
        start = poke_start(runner.db, replace(claimed, claimed_at=None))  # read from the database
        assert start.state == {"k": 1} and not start.final and start.first_poke_at is not None
        [explained] = why(runner.db, run_id, "slow_sensor", worker_stale_s=30)
        assert "next poke at" in explained.reason and "pokes so far: 1" in explained.reason
        assert "timeout 3600 s from the first poke" in explained.reason
        with runner.db.begin() as conn:
            conn.execute(
                ti_table.update()
                .where(ti_table.c.id == claimed.task_instance_id)
                .values(next_attempt_at=row.started_at)
            )
        assert promote_due_retries(runner.db) == 1
        second = _claim(runner)
        assert second.attempt == 2 and second.attempt - second.budget_base == 1
        # The claim read the poke columns: the poke starts from them without another query.
        assert second.claimed_at is not None
        assert poke_start(runner.db, second) == start
        cancelled = cancel_run(runner.db, run_id, actor="test")
        assert cancelled.run_state == "cancelled"
        with runner.db.read() as conn:
            assert job_store.list_for_run(conn, run_id) == []  # a sensor's state is no job
    finally:
        runner.close()


class FileJob(Deferred):
    """A job whose life is a JSON file: {"status": ..., "exit_code": ...}; submits are counted."""

    def __init__(self, path: str, **settings: Any) -> None:
        self.path = path
        super().__init__(**settings)

    def submit(self, context: TaskContext) -> dict[str, Any]:
        state = json.loads(Path(self.path).read_text())
        state["submits"] = state.get("submits", 0) + 1
        Path(self.path).write_text(json.dumps(state))
        return {"path": self.path, "submit": state["submits"]}

    def poll(self, handle: Any, context: TaskContext) -> PollResult:
        state = json.loads(Path(handle["path"]).read_text())
        status = state["script"][min(state.get("polls", 0), len(state["script"]) - 1)]
        state["polls"] = state.get("polls", 0) + 1
        Path(self.path).write_text(json.dumps(state))
        if status == "running":
            return PollResult.running(poll=state["polls"])
        if status == "unknown":
            return PollResult.unknown_commit("the sink's commit status is unknown")
        if status == "success":
            return PollResult.success({"handle": handle})
        return PollResult.failed(int(status), "job failed")

    def cancel(self, handle: Any) -> None:
        state = json.loads(Path(handle["path"]).read_text())
        state["cancelled"] = handle
        Path(handle["path"]).write_text(json.dumps(state))


def test_a_poke_claimed_past_its_deadline_knows_from_the_claim_that_it_is_final(db_url: str) -> None:
    @dag(dag_id="late")
    def late() -> None:
        slow_sensor()

    runner = DagRunner(late, database_url=db_url)
    try:
        run_id = runner.trigger()
        first = _claim(runner)
        assert reschedule_attempt(runner.db, first, worker_id="w1", hostname="h", state={"k": 1}).applied
        # The first poke was two hours ago (timeout 3600 s) and the next one is due now.
        long_ago = datetime(2020, 1, 1, tzinfo=UTC)
        with runner.db.begin() as conn:
            conn.execute(
                ti_table.update()
                .where(ti_table.c.id == first.task_instance_id)
                .values(first_poke_at=long_ago, next_attempt_at=long_ago)
            )
        assert promote_due_retries(runner.db) == 1
        last = _claim(runner)
        start = poke_start(runner.db, last)
        assert (start.state, start.final, start.first_poke_at) == ({"k": 1}, True, long_ago)
        assert _instances(runner, run_id)["slow_sensor"].state == "running"
    finally:
        runner.close()


@pytest.mark.parametrize(
    ("script", "state", "submits", "outcomes"),
    [
        (["running", "running", "success"], "success", 1, ["rescheduled"] * 3 + ["success"]),
        # 20 is retryable under the standard contract: the retry submits anew.
        (["running", "20", "running", "success"], "success", 2, ["rescheduled", "rescheduled", "failed"]),
        (["10"], "dead_letter", 1, ["rescheduled", "failed"]),  # non-retryable
        (["unknown"], "needs_inspection", 1, ["rescheduled", "unknown_commit"]),
    ],
)
def test_submit_then_poll_classifies_the_job_by_its_exit_contract(
    db_url: str, tmp_path: Path, script: list[str], state: str, submits: int, outcomes: list[str]
) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"script": script}))

    @dag(dag_id="deferred")
    def deferred() -> None:
        downstream(
            FileJob(
                str(path), task_id="job", poll_interval=0.02, exit_codes="standard", retries=1, retry_delay=0
            )
        )

    runner = DagRunner(deferred, database_url=db_url)
    try:
        result = runner.run_until_done(runner.trigger())
        assert result.task_states["job"] == state
        assert [a.outcome for a in result.attempts("job")][: len(outcomes)] == outcomes
        assert json.loads(path.read_text())["submits"] == submits
        if state == "success":
            assert result.results["job"] == {"handle": {"path": str(path), "submit": submits}}
            assert result.results["downstream"] == "ran"
    finally:
        runner.close()


def test_cancelling_a_waiting_job_owes_its_cancel_to_a_worker(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"script": ["running"]}))

    @dag(dag_id="cancelled_job")
    def cancelled_job() -> None:
        FileJob(str(path), task_id="job", poll_interval=30)

    runner = DagRunner(cancelled_job, database_url=db_url)
    try:
        run_id = runner.trigger()
        runner._step(run_id)  # the submit: the handle is stored with the reschedule
        row = _instances(runner, run_id)["job"]
        assert row.state == "up_for_reschedule"
        cancel_run(runner.db, run_id, actor="test", reason="wrong input")
        [owed] = claim_job_cancels(runner.db, worker_id="w1", queues=["default"], lease_s=60)
        assert owed.handle == {"path": str(path), "submit": 1} and owed.task_id == "job"
        assert claim_job_cancels(runner.db, worker_id="w2", queues=["default"], lease_s=60) == []
        assert not finish_job_cancel(runner.db, owed, worker_id="w2", error=None)  # not w2's
        assert finish_job_cancel(runner.db, owed, worker_id="w1", error="api down")  # retried later
        with runner.db.read() as conn:
            [pending] = job_store.list_for_run(conn, run_id)
        assert pending["done_at"] is None and pending["error"] == "api down"
        assert claim_job_cancels(runner.db, worker_id="w1", queues=["other"], lease_s=60) == []
    finally:
        runner.close()


def test_a_lost_poke_counts_towards_poison_and_keeps_the_job_handle(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"script": ["running"]}))

    @dag(dag_id="lost_poke")
    def lost_poke() -> None:
        FileJob(str(path), task_id="job", poll_interval=0.01)

    runner = DagRunner(lost_poke, database_url=db_url)
    try:
        run_id = runner.trigger()
        runner._step(run_id)  # the submit
        time.sleep(0.05)
        assert promote_due_retries(runner.db) == 1
        polling = _claim(runner)  # a poll whose worker then dies
        with runner.db.begin() as conn:
            conn.execute(
                ti_table.update()
                .where(ti_table.c.id == polling.task_instance_id)
                .values(lease_expires_at=datetime(2000, 1, 1, tzinfo=UTC))
            )
        assert reap_expired_leases(runner.db) == 1
        row = _instances(runner, run_id)["job"]
        assert (row.state, row.orphaned_count) == ("retry_wait", 1)
        assert poke_start(runner.db, polling).state == {
            "path": str(path),
            "submit": 1,
        }  # polled, not resubmitted
    finally:
        runner.close()


@sensor(poke_interval=30, timeout=3600)
def other_slow_sensor() -> bool:
    return False


def test_a_pass_records_several_reschedules_at_once_and_fences_each(db_url: str) -> None:
    @dag(dag_id="two_sensors")
    def two_sensors() -> None:
        slow_sensor()
        other_slow_sensor()

    runner = DagRunner(two_sensors, database_url=db_url)
    try:
        run_id = runner.trigger()
        claimed = claim_task_instances(
            runner.db, worker_id="w1", hostname="h", queues=["default"], limit=2, lease_s=60
        )
        by_task = {c.task_id: c for c in claimed}
        kept, lost = by_task["slow_sensor"], by_task["other_slow_sensor"]
        with runner.db.begin() as conn:  # another party took the second attempt meanwhile
            conn.execute(
                ti_table.update().where(ti_table.c.id == lost.task_instance_id).values(worker_id="w2")
            )
        cycle = work_cycle(
            runner.db,
            successes=[],
            start=[],
            claim_limit=0,
            claim_start=0,
            worker_id="w1",
            hostname="h",
            queues=["default"],
            lease_s=60,
            reschedules=[
                Reschedule(task=kept, state={"k": 1}, evidence={"seen": 0}, code_version="abc"),
                Reschedule(task=lost, state={"k": 9}, evidence={"seen": 9}),
            ],
        )
        assert [e.applied for e in cycle.rescheduled] == [True, False]
        rows = _instances(runner, run_id)
        row = rows["slow_sensor"]
        assert row.state == "up_for_reschedule" and row.worker_id is None
        assert row.next_attempt_at is not None and kept.started_at is not None
        assert 29 <= (row.next_attempt_at - kept.started_at).total_seconds() <= 60
        assert row.budget_base == kept.budget_base + 1
        assert rows["other_slow_sensor"].state == "running"  # fenced: not this worker's any more
        start = poke_start(runner.db, replace(kept, claimed_at=None, attempt=kept.attempt + 1))
        assert start.state == {"k": 1} and start.first_poke_at is not None
        with runner.db.read() as conn:
            attempts = {a.task_id: a for a in attempt_store.list_attempts(conn, run_id=run_id)}
        recorded = attempts["slow_sensor"]
        assert recorded.outcome == "rescheduled" and recorded.worker_id == "w1"
        assert recorded.outputs == {"seen": 0} and recorded.code_version == "abc"
        assert recorded.duration_s is not None and recorded.duration_s >= 0
        assert "other_slow_sensor" not in attempts  # a discarded report writes no attempt
    finally:
        runner.close()
