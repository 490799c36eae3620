"""Graph rules over task ids: cycle detection (naming the cycle), order, downstream sets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def find_cycle(upstream: Mapping[str, Iterable[str]]) -> list[str] | None:
    """Return one cycle as a list of task ids (first id repeated at the end), or None.

    `upstream` maps each task id to the ids it depends on.
    """
    downstream = downstream_map(upstream)
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(upstream, white)
    for start in sorted(upstream):
        if color[start] != white:
            continue
        # Iterative DFS so deep chains do not hit the recursion limit.
        path: list[str] = [start]
        iters = [iter(sorted(downstream.get(start, ())))]
        color[start] = grey
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                color[path.pop()] = black
                iters.pop()
            elif color.get(nxt, white) == grey:
                return [*path[path.index(nxt) :], nxt]
            elif color.get(nxt, white) == white:
                color[nxt] = grey
                path.append(nxt)
                iters.append(iter(sorted(downstream.get(nxt, ()))))
    return None


def downstream_map(upstream: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Invert an upstream map into task id -> direct downstream ids (sorted)."""
    result: dict[str, list[str]] = {task_id: [] for task_id in upstream}
    for task_id, ups in upstream.items():
        for up in ups:
            result.setdefault(up, []).append(task_id)
    return {k: sorted(v) for k, v in result.items()}


def transitive_downstream(downstream: Mapping[str, Iterable[str]], task_id: str) -> list[str]:
    """Return every task id reachable downstream of `task_id` (excluding itself), sorted."""
    seen: set[str] = set()
    stack = list(downstream.get(task_id, ()))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(downstream.get(current, ()))
    return sorted(seen)


def topological_order(upstream: Mapping[str, Iterable[str]]) -> list[str]:
    """Return task ids so that every task comes after its upstreams: level by level (a task's
    level is one more than its deepest upstream's), ties by id.

    Linear in tasks and edges (plus the sorting of each level): a 5,000-task chain is 5,000
    levels, and scanning every remaining task per level made that quadratic.
    """
    waiting = {k: len(set(v)) for k, v in upstream.items()}
    downstream: dict[str, list[str]] = {}
    for task, ups in upstream.items():
        for up in set(ups):
            downstream.setdefault(up, []).append(task)
    order: list[str] = []
    level = sorted(k for k, n in waiting.items() if n == 0)
    while level:
        order.extend(level)
        following = []
        for done in level:
            for task in downstream.get(done, ()):
                waiting[task] -= 1
                if waiting[task] == 0:
                    following.append(task)
        level = sorted(following)
    if len(order) != len(waiting):
        raise ValueError("graph has a cycle")
    return order
