"""Pure rules of branch tasks (which downstream tasks a result chooses) and mapped tasks (what a
list expands into, its cap, pacing)."""

from __future__ import annotations

import pytest

from treadle.domain.branching import InvalidBranch, chosen_branches
from treadle.domain.mapping import (
    DEFAULT_MAX_MAP_LENGTH,
    MapFailure,
    check_expansion,
    first_active,
)

ALLOWED = {"load_full", "load_delta", "report"}


def test_a_branch_chooses_one_id_a_list_or_nothing() -> None:
    assert chosen_branches("pick", "load_full", ALLOWED) == ["load_full"]
    assert chosen_branches("pick", ["report", "load_delta", "report"], ALLOWED) == ["report", "load_delta"]
    assert chosen_branches("pick", ("report",), ALLOWED) == ["report"]
    assert chosen_branches("pick", None, ALLOWED) == []
    assert chosen_branches("pick", [], ALLOWED) == []


def test_an_id_that_is_not_a_direct_downstream_names_the_allowed_ids() -> None:
    with pytest.raises(InvalidBranch) as info:
        chosen_branches("pick", ["load_full", "cleanup"], ALLOWED)
    assert str(info.value) == (
        "branch task 'pick' chose 'cleanup', which is not among its direct downstream tasks; "
        "allowed: load_delta, load_full, report"
    )


@pytest.mark.parametrize("value", [3, {"task": "report"}, ["report", 2], True])
def test_a_result_that_is_not_task_ids_is_refused(value: object) -> None:
    with pytest.raises(
        InvalidBranch, match=r"must return a task id or a list of task ids, got .*allowed: load"
    ):
        chosen_branches("pick", value, ALLOWED)


def test_a_branch_without_downstream_says_so() -> None:
    with pytest.raises(InvalidBranch, match="allowed: none: it has no downstream tasks"):
        chosen_branches("pick", "x", set())


def test_a_list_expands_within_the_cap() -> None:
    assert check_expansion("process", "discover", [1, 2], task_cap=None, deployment_cap=5) == [1, 2]
    assert check_expansion("process", "discover", [], task_cap=None, deployment_cap=5) == []


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "None (the task returned nothing)"),
        ({"a": 1}, "of type dict: {'a': 1}"),
        ("abc", "of type str: 'abc'"),
        (7, "of type int: 7"),
    ],
)
def test_a_result_that_is_not_a_list_cannot_expand(value: object, kind: str) -> None:
    got = check_expansion("process", "discover", value, task_cap=None, deployment_cap=5)
    assert got == MapFailure(
        error_type="MapSourceNotAList",
        message="mapped task 'process' maps over the result of 'discover', which must be a list; "
        f"it is {kind}",
    )


def test_a_list_over_the_cap_names_the_cap_and_where_it_comes_from() -> None:
    default = check_expansion(
        "process", "discover", list(range(2000)), task_cap=None, deployment_cap=DEFAULT_MAX_MAP_LENGTH
    )
    assert isinstance(default, MapFailure) and default.error_type == "MapLengthExceeded"
    assert (
        "would expand into 2000 instances from the result of 'discover'; the cap is 1024" in default.message
    )
    assert "(TREADLE_MAX_MAP_LENGTH=1024 (the default))" in default.message
    deployment = check_expansion("process", "discover", [1, 2, 3], task_cap=None, deployment_cap=2)
    assert isinstance(deployment, MapFailure)
    assert "the cap is 2 (TREADLE_MAX_MAP_LENGTH=2)" in deployment.message
    own = check_expansion("process", "discover", [1, 2, 3], task_cap=2, deployment_cap=5000)
    assert isinstance(own, MapFailure)
    assert "the cap is 2 (max_map_length=2 on the task)" in own.message
    # The task's own cap wins over the deployment's, both ways.
    assert check_expansion("process", "discover", [1, 2, 3], task_cap=3, deployment_cap=2) == [1, 2, 3]


def test_max_active_mapped_paces_the_instances() -> None:
    assert first_active(10, None) == 10
    assert first_active(10, 3) == 3
    assert first_active(2, 3) == 2
