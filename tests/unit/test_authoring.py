"""Authoring API: DAG building, dependencies, serialization and every validation error."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from treadle import TaskContext, dag, task
from treadle.domain.dag_version import DagStructure
from treadle.errors import DagDefinitionError


@task
def one() -> int:
    return 1


@task
def add(a: int, b: int = 0) -> int:
    return a + b


@task(retries=3, retry_delay=timedelta(seconds=5), backoff_factor=3, timeout=60, queue="heavy")
def configured(context: TaskContext) -> str:
    return context.task_id


def test_data_flow_and_shift_dependencies_become_edges() -> None:
    @dag(dag_id="flow", owner="data", tags=["x"])
    def flow() -> None:
        x = one()
        y = add(x, b=2)
        configured() >> y

    structure = flow.structure()
    assert structure.tasks["add"].upstream == ("configured", "one")
    assert structure.tasks["add"].args[0].upstream == "one"
    assert structure.tasks["add"].kwargs["b"].literal == 2
    assert structure.tasks["configured"].retry.retries == 3
    assert structure.tasks["configured"].retry.retry_delay_s == 5
    assert structure.tasks["configured"].timeout_s == 60
    assert structure.tasks["configured"].queue == "heavy"
    assert flow.tasks["configured"].takes_context


def test_structure_round_trips_and_hash_is_stable() -> None:
    @dag(dag_id="rt")
    def rt() -> None:
        add(one(), b=5)

    s = rt.structure()
    again = DagStructure.from_json(s.to_json())
    assert again == s
    assert again.content_hash() == s.content_hash()


def test_default_args_apply_and_task_settings_override() -> None:
    @dag(dag_id="defaults", default_args={"retries": 2, "queue": "q1"})
    def defaults() -> None:
        one()
        configured()

    s = defaults.structure()
    assert (s.tasks["one"].retry.retries, s.tasks["one"].queue) == (2, "q1")
    assert (s.tasks["configured"].retry.retries, s.tasks["configured"].queue) == (3, "heavy")


def test_calling_a_task_twice_gets_suffixed_ids() -> None:
    @dag(dag_id="twice")
    def twice() -> None:
        one()
        one()

    assert sorted(twice.tasks) == ["one", "one__1"]


def test_task_function_outside_a_dag_just_runs() -> None:
    assert add(2, b=3) == 5


def _build(body: Any, **kwargs: Any) -> Any:
    return dag(dag_id="bad", **kwargs)(body)


def test_cycle_is_rejected_and_named() -> None:
    def body() -> None:
        a, b = one(), add(1)
        a >> b
        b >> a

    with pytest.raises(DagDefinitionError, match=r"cycle: (one -> add -> one|add -> one -> add)"):
        _build(body)


def test_unknown_task_id_is_rejected() -> None:
    @task(depends_on=["nope"])
    def child() -> None:
        return None

    with pytest.raises(DagDefinitionError, match="unknown task id 'nope'"):
        _build(lambda: child())


def test_duplicate_explicit_task_id_is_rejected() -> None:
    @task(task_id="same")
    def first() -> None:
        return None

    @task(task_id="same")
    def second() -> None:
        return None

    def body() -> None:
        first()
        second()

    with pytest.raises(DagDefinitionError, match="duplicate task id 'same'"):
        _build(body)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"retries": -1}, "retries must be an integer >= 0"),
        ({"retry_delay": "5m"}, "retry_delay must be seconds"),
        ({"backoff_factor": 0.5}, "backoff_factor must be a number >= 1"),
        ({"jitter": 2}, r"jitter must be a number in \[0, 1\]"),
        ({"timeout": 0}, "timeout must be > 0"),
        ({"queue": "bad queue"}, "queue must match"),
        ({"on_retry": "notify"}, "on_retry must be callable"),
    ],
)
def test_invalid_settings_are_named(settings: dict[str, Any], message: str) -> None:
    @task(**settings)
    def t() -> None:
        return None

    with pytest.raises(DagDefinitionError, match=message):
        _build(lambda: t())


def test_unknown_setting_is_rejected_at_decoration() -> None:
    with pytest.raises(DagDefinitionError, match="unknown setting"):
        task(retires=3)


def test_unknown_default_arg_is_rejected() -> None:
    with pytest.raises(DagDefinitionError, match="unknown default_args"):
        _build(lambda: one(), default_args={"retrys": 1})


def test_non_json_literal_argument_is_rejected() -> None:
    with pytest.raises(DagDefinitionError, match="not JSON-serializable"):
        _build(lambda: add(object()))


def test_wrong_arguments_are_reported_at_definition() -> None:
    with pytest.raises(DagDefinitionError, match="missing a required argument"):
        _build(lambda: add())


def test_invalid_dag_id_is_rejected() -> None:
    with pytest.raises(DagDefinitionError, match="dag id"):
        dag(dag_id="has space")(lambda: one())


def test_empty_dag_is_rejected() -> None:
    with pytest.raises(DagDefinitionError, match="has no tasks"):
        _build(lambda: None)
