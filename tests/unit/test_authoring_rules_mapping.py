"""Authoring trigger rules, branch tasks and mapped tasks: what the decorators place, what the
serialized structure holds, and the definition errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from treadle import dag, task
from treadle.domain.dag_version import DagStructure, TaskDef
from treadle.errors import DagDefinitionError


@task
def discover() -> list[int]:
    return [1, 2, 3]


@task(max_map_length=50, max_active_mapped=4)
def process(item: int, factor: int = 1) -> int:
    return item * factor


@task(trigger_rule="all_done")
def reduce(values: list[int | None]) -> int:
    return sum(v for v in values if v is not None)


@task.branch
def pick(n: int) -> str:
    return "big" if n > 2 else "small"


@task.branch(retries=2)
def pick_many() -> list[str]:
    return ["big"]


@task
def big() -> str:
    return "big"


@task(trigger_rule="none_failed_min_one_success")
def join() -> str:
    return "joined"


def test_rules_branches_and_mapping_land_in_the_structure() -> None:
    @dag(dag_id="shapes")
    def shapes() -> None:
        found = discover()
        reduce(process.partial(factor=10).expand(item=found))
        choice = pick(3)
        choice >> [big(), big()]
        [big(), choice] >> join()

    s = shapes.structure()
    mapped = s.tasks["process"]
    assert (mapped.map_arg, mapped.map_source, mapped.is_mapped) == ("item", "discover", True)
    assert mapped.kwargs["factor"].literal == 10
    assert (mapped.max_map_length, mapped.max_active_mapped) == (50, 4)
    assert s.tasks["reduce"].trigger_rule == "all_done"
    assert s.tasks["pick"].branch and not s.tasks["big"].branch
    assert s.tasks["join"].trigger_rule == "none_failed_min_one_success"
    assert s.tasks["join"].upstream == ("big__2", "pick")
    again = DagStructure.from_json(json.loads(json.dumps(s.to_json())))
    assert again == s and again.content_hash() == s.content_hash()


def test_settings_left_at_their_defaults_are_not_serialized() -> None:
    """A DAG that uses none of these keeps the version hash it had before they existed."""
    plain = TaskDef(task_id="t").to_json()
    for key in ("trigger_rule", "branch", "map_arg", "max_map_length", "max_active_mapped"):
        assert key not in plain
    old = {"task_id": "t", "upstream": [], "args": [], "kwargs": {}, "retries": 0}
    assert TaskDef.from_json(old).trigger_rule == "all_success"
    set_ = TaskDef(task_id="t", trigger_rule="one_failed", branch=True).to_json()
    assert (set_["trigger_rule"], set_["branch"]) == ("one_failed", True)


def test_mapping_settings_of_an_unmapped_placement_are_not_kept() -> None:
    @dag(dag_id="unmapped")
    def unmapped() -> None:
        process(1)

    d = unmapped.structure().tasks["process"]
    assert (d.map_arg, d.max_map_length, d.max_active_mapped) == (None, None, None)


def test_branch_and_trigger_rule_settings_can_be_dag_defaults() -> None:
    @dag(dag_id="defaults", default_args={"trigger_rule": "all_done"})
    def defaults() -> None:
        big()
        pick_many()

    s = defaults.structure()
    assert s.tasks["big"].trigger_rule == "all_done"
    assert s.tasks["pick_many"].branch and s.tasks["pick_many"].retry.retries == 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"trigger_rule": "any"}, "trigger_rule must be one of all_success, all_done, all_failed"),
        ({"max_map_length": 0}, "max_map_length must be an integer >= 1, got 0"),
        ({"max_active_mapped": "2"}, "max_active_mapped must be an integer >= 1, got '2'"),
    ],
)
def test_invalid_rule_and_mapping_settings_are_named(settings: dict[str, Any], message: str) -> None:
    @task(**settings)
    def bad() -> None:
        return None

    with pytest.raises(DagDefinitionError, match=message):

        @dag(dag_id="bad_settings")
        def bad_settings() -> None:
            bad()


def _place(body: Any) -> None:
    @dag(dag_id="mapping_errors")
    def mapping_errors() -> None:
        body()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (lambda: process.expand(item=discover(), factor=discover()), "takes exactly one keyword argument"),
        (lambda: process.expand(), r"takes exactly one keyword argument, the list to map over \(got none\)"),
        (lambda: process.expand(item=[1, 2]), "item= must be the output of a task call"),
        (lambda: process.partial(item=1).expand(item=discover()), "'item' is given both to partial"),
        (lambda: pick.expand(n=discover()), "a branch task cannot be mapped"),
        (lambda: process.partial(nope=1).expand(item=discover()), "unexpected keyword argument 'nope'"),
    ],
)
def test_bad_mapped_placements_are_refused_at_definition(body: Any, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message):
        _place(body)


def test_a_mapped_task_cannot_use_the_always_rule() -> None:
    @task(trigger_rule="always")
    def anytime(item: int) -> int:
        return item

    with pytest.raises(DagDefinitionError, match="trigger_rule='always' cannot apply"):
        _place(lambda: anytime.expand(item=discover()))


def test_expand_outside_a_dag_is_refused() -> None:
    with pytest.raises(DagDefinitionError, match="a mapped task is placed inside a @dag function"):
        process.expand(item=[1])


def test_a_branch_function_still_runs_outside_a_dag() -> None:
    assert pick(1) == "small"
