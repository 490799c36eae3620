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


def _levels_by_rescanning(upstream: dict[str, set[str]]) -> list[str] | None:
    """The definition: repeatedly take every task whose upstreams are all placed, sorted by id."""
    remaining = {k: set(v) for k, v in upstream.items()}
    order: list[str] = []
    while remaining:
        ready = sorted(k for k, v in remaining.items() if not v)
        if not ready:
            return None
        for k in ready:
            del remaining[k]
        for v in remaining.values():
            v.difference_update(ready)
        order.extend(ready)
    return order


def test_topological_order_is_level_by_level_with_ties_by_id() -> None:
    import random

    rng = random.Random(7)
    for trial in range(500):
        ids = [f"t{rng.randint(0, 99):02d}_{i}" for i in range(rng.randint(0, 25))]
        rng.shuffle(ids)
        upstream = {t: set(rng.sample(ids[:i], k=min(i, rng.randint(0, 3)))) for i, t in enumerate(ids)}
        if trial % 5 == 0 and len(ids) > 2:
            a, b = rng.sample(ids, 2)
            upstream[a].add(b)
            upstream[b].add(a)
        expected = _levels_by_rescanning(upstream)
        if expected is None:
            try:
                topological_order(upstream)
            except ValueError:
                continue
            raise AssertionError(f"no cycle reported for {upstream}")
        assert topological_order(upstream) == expected
    assert topological_order({"b": {"a"}, "c": {"a"}, "a": set(), "d": {"b", "c"}}) == ["a", "b", "c", "d"]
