"""Graph rules: cycles are found and named; downstream sets and order are right."""

from __future__ import annotations

from treadle.domain.graph import downstream_map, find_cycle, topological_order, transitive_downstream


def test_no_cycle_in_a_diamond() -> None:
    assert find_cycle({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}) is None


def test_cycle_is_named_in_order() -> None:
    cycle = find_cycle({"a": ["c"], "b": ["a"], "c": ["b"], "x": []})
    assert cycle is not None
    assert cycle[0] == cycle[-1]
    assert set(cycle) == {"a", "b", "c"}
    assert len(cycle) == 4


def test_self_loop_is_a_cycle() -> None:
    assert find_cycle({"a": ["a"]}) == ["a", "a"]


def test_deep_chain_does_not_hit_recursion_limit() -> None:
    upstream = {f"t{i}": [f"t{i - 1}"] if i else [] for i in range(5000)}
    assert find_cycle(upstream) is None
    assert topological_order(upstream)[:3] == ["t0", "t1", "t2"]


def test_transitive_downstream() -> None:
    down = downstream_map({"a": [], "b": ["a"], "c": ["b"], "d": []})
    assert transitive_downstream(down, "a") == ["b", "c"]
    assert transitive_downstream(down, "d") == []
