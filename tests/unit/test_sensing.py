"""Sensor rules without a database: when a poke is the last, when the next is due, how sensor
settings are validated and serialized (old DAG versions keep their hash), and what a poke
answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from treadle import Deferred, PollResult, Ready, Waiting, dag, sensor, task
from treadle.authoring.context import Poke, TaskContext
from treadle.authoring.sensing import POKE_KEY, JobFailed, deferred_of
from treadle.domain.dag_version import TaskDef
from treadle.domain.exit_codes import Disposition
from treadle.domain.sensing import PokeKind, SensorSpec, is_final_poke, next_poke_at
from treadle.errors import DagDefinitionError

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_the_final_poke_is_the_first_at_or_past_the_timeout() -> None:
    spec = SensorSpec(poke_interval_s=60, timeout_s=300)
    assert not is_final_poke(spec, first_poke_at=None, now=T0)
    assert not is_final_poke(spec, first_poke_at=T0, now=T0 + timedelta(seconds=299))
    assert is_final_poke(spec, first_poke_at=T0, now=T0 + timedelta(seconds=300))
    assert not is_final_poke(SensorSpec(timeout_s=None), first_poke_at=T0, now=T0 + timedelta(days=99))


def test_the_next_poke_never_lands_past_the_deadline() -> None:
    spec = SensorSpec(poke_interval_s=60, timeout_s=300)
    assert next_poke_at(spec, first_poke_at=T0, now=T0) == T0 + timedelta(seconds=60)
    assert next_poke_at(spec, first_poke_at=T0, now=T0 + timedelta(seconds=270)) == T0 + timedelta(
        seconds=300
    )
    late = T0 + timedelta(seconds=400)
    assert next_poke_at(spec, first_poke_at=T0, now=late) == late


def test_sensor_settings_round_trip_and_leave_other_tasks_json_alone() -> None:
    plain = TaskDef(task_id="t")
    assert "sensor" not in plain.to_json()  # existing DAG versions keep their hash
    assert TaskDef.from_json(plain.to_json()) == plain
    sensed = TaskDef(
        task_id="s",
        sensor=SensorSpec(kind=PokeKind.DEFERRED, poke_interval_s=5, timeout_s=None, soft_fail=True),
    )
    assert TaskDef.from_json(sensed.to_json()) == sensed


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"mode": "poke"}, "mode must be 'reschedule'"),
        ({"poke_interval": 0}, "poke_interval must be > 0"),
        ({"poke_interval": "1m"}, "poke_interval must be seconds"),
        ({"timeout": -1}, "timeout must be > 0"),
        ({"soft_fail": "yes"}, "soft_fail must be True or False"),
        ({"retrys": 1}, "unknown setting(s) retrys"),
    ],
)
def test_bad_sensor_settings_are_named(settings: dict[str, Any], problem: str) -> None:
    with pytest.raises(DagDefinitionError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        sensor(**settings)(lambda: True)


@sensor(poke_interval=timedelta(seconds=30), timeout=600, soft_fail=True, retries=2)
def landed(context: TaskContext) -> Any:
    state = context.poke.state if context.poke else None
    if state == "seen":
        return Ready(value=1, evidence={"rows": 1})
    return Waiting(state="seen") if state is None else False


@task
def after(n: int) -> int:
    return n


class Job(Deferred):
    def submit(self, context: TaskContext) -> Any:
        return {"id": 1}

    def poll(self, handle: Any, context: TaskContext) -> PollResult:
        code = context.params.get("code")
        return PollResult.running() if code is None else PollResult.failed(code)

    def cancel(self, handle: Any) -> None:
        context_cancelled.append(handle)


context_cancelled: list[Any] = []


@dag(dag_id="placed")
def placed() -> None:
    after(landed())
    after(Job(task_id="job", poll_interval=5, exit_codes="standard"))


def _context(state: Any = None, *, final: bool = False, params: dict[str, Any] | None = None) -> TaskContext:
    return TaskContext(
        run_id="r",
        dag_id="placed",
        task_id="x",
        logical_date=T0,
        attempt=1,
        params=params or {},
        poke=Poke(state=state, final=final),
    )


def test_sensors_and_jobs_are_placed_with_their_settings() -> None:
    structure = placed.structure()
    assert structure.tasks["landed"].sensor == SensorSpec(poke_interval_s=30, timeout_s=600, soft_fail=True)
    assert structure.tasks["landed"].retry.retries == 2
    assert structure.tasks["job"].sensor == SensorSpec(kind=PokeKind.DEFERRED, poke_interval_s=5)
    assert structure.tasks["after__1"].upstream == ("job",)
    assert isinstance(deferred_of(placed.tasks["job"].fn), Job)
    assert deferred_of(placed.tasks["landed"].fn) is None


def test_a_sensor_answers_wait_ready_or_timeout() -> None:
    poke = placed.tasks["landed"].fn
    assert poke(context=_context()) == {
        POKE_KEY: "wait",
        "state": "seen",
        "evidence": None,
        "submitted": False,
    }
    assert poke(context=_context("seen")) == {POKE_KEY: "ready", "value": 1, "evidence": {"rows": 1}}
    assert poke(context=_context("other", final=True)) == {POKE_KEY: "timeout", "evidence": None}


def test_a_job_submits_once_then_polls_and_classifies_its_exit_code() -> None:
    run = placed.tasks["job"].fn
    assert run(context=_context()) == {
        POKE_KEY: "wait",
        "state": {"id": 1},
        "evidence": {"submitted": {"id": 1}},
        "submitted": True,
    }
    assert run(context=_context({"id": 1}))[POKE_KEY] == "wait"
    with pytest.raises(JobFailed) as failed:
        run(context=_context({"id": 1}, params={"code": 30}))
    assert (failed.value.disposition, failed.value.exit_code) == (Disposition.NON_RETRYABLE, 30)
    with pytest.raises(JobFailed) as unknown:
        run(context=_context({"id": 1}, params={"code": 60}))
    assert unknown.value.disposition is Disposition.UNKNOWN_COMMIT
    assert run(context=_context({"id": 1}, params={"code": 0}))[POKE_KEY] == "ready"
    assert run(context=_context({"id": 1}, final=True)) == {
        POKE_KEY: "timeout",
        "evidence": {"cancelled": True},
    }
    assert context_cancelled == [{"id": 1}]


def test_a_handle_must_be_json() -> None:
    class Bad(Job):
        def submit(self, context: TaskContext) -> Any:
            return {"when": T0}

    @dag(dag_id="bad_handle")
    def bad_handle() -> None:
        Bad(task_id="bad")

    with pytest.raises(JobFailed, match="not strict JSON") as failed:
        bad_handle.tasks["bad"].fn(context=_context())
    assert failed.value.disposition is Disposition.NON_RETRYABLE
