"""Messages between a worker and its child processes: JSON over a pipe (never pickle)."""

from __future__ import annotations

import json
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from treadle.domain.dag_version import ArgRef, DagVersion
from treadle.domain.exit_codes import Disposition
from treadle.domain.task_records import AttemptDetails, AttemptError, ClaimedTask

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
    """Build the domain error from a child's error message.

    A reply classifies its failure with "disposition" (retryable, non_retryable,
    unknown_commit); the older "retryable" flag is read when it has none.
    """
    disposition = data.get("disposition")
    if disposition is None:
        disposition = Disposition.RETRYABLE if data.get("retryable", True) else Disposition.NON_RETRYABLE
    return AttemptError(
        error_type=str(data.get("error_type", "Error")),
        message=str(data.get("message", "")),
        traceback=str(data.get("traceback", "")),
        frame=str(data.get("frame", "")),
        retryable=disposition == Disposition.RETRYABLE,
        unknown_commit=disposition == Disposition.UNKNOWN_COMMIT,
        exit_code=_int_or_none(data.get("exit_code")),
        code_version=_str_or_none(data.get("code_version")),
        outputs=data["outputs"] if isinstance(data.get("outputs"), dict) and data["outputs"] else None,
    )


def to_attempt_details(data: Message) -> AttemptDetails:
    """What a child's success reply says besides the result."""
    outputs = data.get("outputs")
    return AttemptDetails(
        exit_code=_int_or_none(data.get("exit_code")),
        code_version=_str_or_none(data.get("code_version")),
        outputs=outputs if isinstance(outputs, dict) and outputs else None,
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value[:64] if isinstance(value, str) and value else None


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
        # The file it comes from: a task process that has not imported it yet imports only it.
        "fileloc": version.structure.fileloc,
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
