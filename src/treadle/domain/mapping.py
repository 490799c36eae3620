"""Dynamic task mapping: checking the list a mapped task expands over, and pacing its instances.

Pure: the engine reads the upstream's result and the task's settings, and this module says how
many instances to create or why the expansion fails (never worth retrying: the same result
fails the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Most elements a mapped task maps over unless its own `max_map_length` says otherwise.
DEFAULT_MAX_MAP_LENGTH = 1_024
#: The setting that changes that default for a deployment.
MAP_LENGTH_SETTING = "TREADLE_MAX_MAP_LENGTH"


@dataclass(frozen=True, slots=True, kw_only=True)
class MapFailure:
    """Why a mapped task cannot expand: its error type and a message naming the problem."""

    error_type: str
    message: str


def check_expansion(
    task_id: str, source: str, value: Any, *, task_cap: int | None, deployment_cap: int
) -> list[Any] | MapFailure:
    """The elements a mapped task expands into, or why it cannot (`value`: the source's result).

    The cap is the task's own `max_map_length` when it set one, else the deployment's.
    """
    if not isinstance(value, list):
        return MapFailure(
            error_type="MapSourceNotAList",
            message=f"mapped task {task_id!r} maps over the result of {source!r}, which must be a "
            f"list; it is {_kind(value)}",
        )
    cap = task_cap if task_cap is not None else deployment_cap
    if len(value) > cap:
        where = (
            f"max_map_length={cap} on the task"
            if task_cap is not None
            else f"{MAP_LENGTH_SETTING}={cap}" + (" (the default)" if cap == DEFAULT_MAX_MAP_LENGTH else "")
        )
        return MapFailure(
            error_type="MapLengthExceeded",
            message=f"mapped task {task_id!r} would expand into {len(value)} instances from the "
            f"result of {source!r}; the cap is {cap} ({where}); raise it with max_map_length= on the "
            f"task or {MAP_LENGTH_SETTING}, or return fewer elements",
        )
    return value


def first_active(length: int, max_active: int | None) -> int:
    """How many instances of an expansion of `length` are queued at once (the rest wait)."""
    return length if max_active is None else min(length, max_active)


def instance_label(task_id: str, map_index: int) -> str:
    """How operators see a task instance: `task`, `task[3]` for a mapped instance, and
    `task[retired]` for one a clear took out of its task."""
    if map_index == -1:
        return task_id
    return f"{task_id}[{map_index}]" if map_index >= 0 else f"{task_id}[retired]"


def _kind(value: Any) -> str:
    if value is None:
        return "None (the task returned nothing)"
    return f"of type {type(value).__name__}: {value!r:.100}"
