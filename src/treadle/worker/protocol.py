"""Messages between a worker and its child processes: JSON over a pipe (never pickle)."""

from __future__ import annotations

import json
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from treadle.domain.dag_version import ArgRef, DagVersion
from treadle.domain.records import AttemptError, ClaimedTask

#: Any: messages are JSON objects.
Message = dict[str, Any]


def send(conn: Connection, message: Message) -> None:
    """Send one message."""
    conn.send_bytes(json.dumps(message).encode())


def receive(conn: Connection) -> Message:
    """Receive one message (raises EOFError when the other side is gone)."""
    data: Message = json.loads(conn.recv_bytes())
    return data


def error_message(exc: BaseException, *, user_roots: tuple[str, ...]) -> Message:
    """Describe an exception: type, message, traceback, and the innermost frame of user code."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if any(f.filename.startswith(r) for r in user_roots)]
    inner = (user or frames)[-1] if (user or frames) else None
    frame = f"{Path(inner.filename).name}:{inner.name}" if inner else ""
    return {
        "error_type": type(exc).__name__,
        "message": str(exc) or type(exc).__name__,
        "traceback": "".join(traceback.format_exception(exc)),
        "frame": frame,
    }


def to_attempt_error(data: Message) -> AttemptError:
    """Build the domain error from a child's error message."""
    return AttemptError(
        error_type=str(data.get("error_type", "Error")),
        message=str(data.get("message", "")),
        traceback=str(data.get("traceback", "")),
        frame=str(data.get("frame", "")),
        retryable=bool(data.get("retryable", True)),
    )


def run_message(task: ClaimedTask, version: DagVersion) -> Message:
    """Build the request to run one claimed attempt, with its arguments resolved."""
    definition = version.structure.tasks[task.task_id]

    def resolve(arg: ArgRef) -> Any:
        return task.upstream_results.get(arg.upstream) if arg.upstream else arg.literal

    return {
        "kind": "run",
        "dag_id": task.dag_id,
        "task_id": task.task_id,
        "run_id": task.run_id,
        "attempt": task.attempt,
        "logical_date": task.logical_date.isoformat(),
        "params": task.conf,
        "manifest": task.manifest,
        "upstream_results": task.upstream_results,
        "version_hash": version.version_hash,
        "args": [resolve(a) for a in definition.args],
        # A mapped instance's mapped argument is its element of the list.
        "kwargs": {
            k: task.map_item if k == definition.map_arg and task.map_index >= 0 else resolve(v)
            for k, v in definition.kwargs.items()
        },
        "map_index": task.map_index,
        # Datasets the task may annotate through `context.outlet_event`.
        "outlets": list(definition.outlets),
    }
