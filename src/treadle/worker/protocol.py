"""Messages between a worker and its child processes: JSON over a pipe (never pickle)."""

from __future__ import annotations

import json
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from treadle.domain.records import AttemptError

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
