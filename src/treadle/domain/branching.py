"""Branch tasks: the result names which direct downstream tasks run; the others are skipped."""

from __future__ import annotations

from collections.abc import Collection


class InvalidBranch(ValueError):
    """A branch task returned something other than ids of its direct downstream tasks."""


def chosen_branches(task_id: str, value: object, allowed: Collection[str]) -> list[str]:
    """The downstream task ids a branch task's result chooses, in the order given, once each.

    The result is a task id, a list of task ids, or None (or an empty list): no downstream task
    runs. Anything else, or an id that is not a direct downstream of the task, raises
    InvalidBranch naming the ids allowed.
    """
    listed = ", ".join(sorted(allowed)) or "none: it has no downstream tasks"
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise InvalidBranch(
            f"branch task {task_id!r} must return a task id or a list of task ids, got {value!r}; "
            f"allowed: {listed}"
        )
    unknown = [i for i in items if i not in allowed]
    if unknown:
        raise InvalidBranch(
            f"branch task {task_id!r} chose {', '.join(map(repr, unknown))}, which "
            f"{'is' if len(unknown) == 1 else 'are'} not among its direct downstream tasks; "
            f"allowed: {listed}"
        )
    return list(dict.fromkeys(items))
