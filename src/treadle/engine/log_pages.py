"""Pages of an attempt's log by byte offset, for readers that poll (the API's followable logs).

A reader asks from an offset and gets the bytes that are there, the offset to ask next, and
whether the log is complete: the attempt has ended and the page reached the end of its file.
The running check happens before the file is read, so an attempt that ends between the two is
reported incomplete and the next poll returns the rest. Reads only; the file lives on the host
of the worker that ran the attempt (engine/attempt_logs.py finds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from treadle.engine.attempt_logs import AttemptLocation, is_running, locate_attempt
from treadle.errors import AttemptLogMissing, InvalidRequest, RunNotFound
from treadle.store import runs as run_store
from treadle.store.database import Database

#: Largest page a reader may ask for, in bytes.
MAX_PAGE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPage:
    """Part of one attempt's log."""

    run_id: str
    task_id: str
    map_index: int
    attempt: int
    #: Where this page starts in the file, in bytes.
    offset: int
    #: Where the next page starts: ask from here to follow the log.
    next_offset: int
    #: The file's size when it was read (0 when it does not exist yet).
    size: int
    #: The page's bytes as UTF-8 text (invalid bytes replaced); it ends on a character boundary.
    text: str
    #: The attempt is its task instance's running one: more output may come.
    running: bool
    #: Nothing more will come: the attempt has ended and this page reached the end of the file.
    complete: bool
    #: The host whose logs folder holds the file (None: not recorded).
    hostname: str | None


def dag_of_run(db: Database, run_id: str) -> str:
    """The DAG id of a run (one row read: a poller asks this every page); RunNotFound if none."""
    run = db.query(lambda conn: run_store.get_run(conn, run_id))
    if run is None:
        raise RunNotFound(f"no run {run_id!r}")
    return run.dag_id


def read_log_page(
    db: Database,
    run_id: str,
    task_id: str,
    *,
    logs_dir: Path | None,
    attempt: int | None = None,
    map_index: int = -1,
    offset: int = 0,
    limit: int = 64 * 1024,
) -> LogPage:
    """Up to `limit` bytes of an attempt's log from `offset` (default attempt: the latest).

    Raises InvalidRequest for a bad offset or limit, RunNotFound / TaskInstanceNotFound /
    InvalidRequest for an unknown run, task or attempt (as locate_attempt), and AttemptLogMissing
    when the attempt has ended and its file is not in `logs_dir` (None: this process serves no logs).
    """
    if offset < 0:
        raise InvalidRequest(f"offset: must be 0 or more, got {offset}")
    if not 1 <= limit <= MAX_PAGE_BYTES:
        raise InvalidRequest(f"limit: must be in 1..{MAX_PAGE_BYTES} bytes, got {limit}")
    location = locate_attempt(db, run_id, task_id, attempt=attempt, map_index=map_index)
    running = location.running and is_running(db, location)
    if logs_dir is None:
        raise AttemptLogMissing(
            "this API process has no logs folder to read attempt logs from",
            path="",
            hostname=location.hostname,
        )
    path = location.log_path(logs_dir)
    try:
        size, data = _read(path, offset=offset, limit=limit)
    except FileNotFoundError:
        if not running:
            raise _missing(path, location) from None
        size, data = 0, b""  # a starting attempt may not have opened its file yet
    if offset > size and not running:
        raise InvalidRequest(f"offset: the log has {size} bytes; {offset} is past its end")
    if offset + len(data) < size or running:  # more may follow: end on a whole character
        data = data[: whole_characters(data) or len(data)]
    next_offset = offset + len(data)
    return LogPage(
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
        attempt=location.attempt,
        offset=offset,
        next_offset=next_offset,
        size=size,
        text=data.decode("utf-8", errors="replace"),
        running=running,
        complete=not running and next_offset >= size,
        hostname=location.hostname,
    )


def _read(path: Path, *, offset: int, limit: int) -> tuple[int, bytes]:
    with path.open("rb") as log:
        size = log.seek(0, 2)
        log.seek(min(offset, size))
        return size, log.read(limit)


def whole_characters(data: bytes) -> int:
    """How many leading bytes of `data` end on a UTF-8 character boundary.

    A page cut inside a multi-byte character leaves that character's first bytes to the next
    page, so no character is split between two pages. Invalid UTF-8 is kept as it is.
    """
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80 or byte >= 0xF8:
            return len(data)  # ASCII (nothing pending) or a byte no character starts with
        if byte >= 0xC0:  # the lead byte of the last character: is it whole?
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= needed else len(data) - back
    return len(data)


def _missing(path: Path, location: AttemptLocation) -> AttemptLogMissing:
    what = f"attempt {location.attempt} of task {location.task_id!r} in run {location.run_id!r}"
    where = f"it ran on {location.hostname}" if location.hostname else "its host is not recorded"
    return AttemptLogMissing(
        f"no log of {what} in this API host's logs folder ({where}); logs stay on the host of the "
        "worker that ran the attempt",
        path=str(path),
        hostname=location.hostname,
    )
