"""Process logs: JSON lines (a stable `event` key, ids as fields) or readable text on a terminal.

`TREADLE_LOG_FORMAT` picks `json` or `text`; unset, a terminal gets coloured text and anything
else (a pipe, a file, journald) JSON. The ids of the attempt a thread works on (run_id, dag_id,
task_id, map_index, attempt) come from `attempt_fields`, a context variable each slot sets while
it runs one; process-wide ids (worker_id) from `ProcessFields.bind`. Task output never comes
here: it goes to the attempt's own log file (worker/attempt_log.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import IO, Any

#: Record attributes that are not fields of the line: the standard ones, and uvicorn's
#: `color_message` (its message again, with terminal colour codes).
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}

#: The formats TREADLE_LOG_FORMAT accepts.
LOG_FORMATS = ("json", "text")

#: Ids of the attempt the current thread works on (set by `attempt_context`).
attempt_fields: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "treadle_attempt_fields", default=None
)


@contextlib.contextmanager
def attempt_context(**fields: Any) -> Iterator[None]:  # Any: ids (str, int)
    """Add `fields` (run_id, dag_id, task_id, map_index, attempt) to every record logged inside."""
    token = attempt_fields.set(fields)
    try:
        yield
    finally:
        attempt_fields.reset(token)


class ProcessFields(logging.Filter):
    """Adds process-wide ids (worker_id) and the current attempt's ids to each record, without
    overwriting what a call passed in `extra=`."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, Any] = {}  # Any: ids

    def bind(self, **fields: Any) -> None:  # Any: ids
        """Add `fields` to every record from now on."""
        self.fields = {**self.fields, **fields}

    def filter(self, record: logging.LogRecord) -> bool:
        """Attach the fields; never drops a record."""
        for fields in (attempt_fields.get(), self.fields):
            for key, value in (fields or {}).items():
                if key not in record.__dict__:
                    setattr(record, key, value)
        return True


def _extra(record: logging.LogRecord) -> dict[str, Any]:  # Any: JSON values
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        """ts, level, logger, message, then every field the record carries."""
        data = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(_extra(record))
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


_COLOURS = {"DEBUG": "\033[2m", "INFO": "\033[32m", "WARNING": "\033[33m", "ERROR": "\033[31m"}
_RESET, _DIM = "\033[0m", "\033[2m"


class TextFormatter(logging.Formatter):
    """One readable line per record: time, level, message, event and fields; coloured if asked."""

    def __init__(self, *, colour: bool) -> None:
        super().__init__()
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        """`12:00:01 INFO  message  event=… run_id=…`, then the traceback if any."""
        at = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S")
        level = f"{record.levelname:<7}"
        fields = " ".join(f"{k}={v}" for k, v in _extra(record).items())
        if self.colour:
            colour = _COLOURS.get(record.levelname, "\033[1;31m")
            level = f"{colour}{level}{_RESET}"
            fields = f"{_DIM}{fields}{_RESET}" if fields else ""
        line = f"{at} {level} {record.getMessage()}" + (f"  {fields}" if fields else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def resolve_format(requested: str | None, stream: IO[str]) -> str:
    """The format to use: the one asked for, else text on a terminal and JSON elsewhere."""
    if requested is not None:
        return requested
    return "text" if stream.isatty() else "json"


def configure_logging(level: str = "INFO", *, log_format: str | None = None) -> ProcessFields:
    """Send log lines to stderr in `log_format` (see `resolve_format`); returns the filter that
    adds ids to every record, for the process to `bind` its own."""
    stream = sys.stderr
    handler = logging.StreamHandler(stream)
    if resolve_format(log_format, stream) == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(colour=stream.isatty()))
    fields = ProcessFields()
    handler.addFilter(fields)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Alembic's INFO lines (its plugins, "Context impl ...", "Running upgrade ...") would open
    # every start's log; store/migrate.py logs each revision it applies itself.
    logging.getLogger("alembic").setLevel(logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)
    return fields
