"""Per-attempt logs: a size-capped file on the worker's host, and the redirection of a task
process's stdout and stderr into it for the duration of one attempt.

Task output never reaches the worker's own log: fds 1 and 2 of the task process point at a pipe
whose reader copies into the attempt's file until the attempt ends. A write that fails (a full
disk) loses log lines, never the attempt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from treadle.config import Settings
from treadle.domain.commands import attempt_log_path
from treadle.domain.task_records import ClaimedTask

logger = logging.getLogger("treadle.worker.child")

#: Bytes read from a pipe at a time.
CHUNK = 64 * 1024
#: How long the end of an attempt waits for the last output of its pipes (seconds).
DRAIN_S = 5.0
#: Mode of log files and their folders: task output may hold data.
FILE_MODE, FOLDER_MODE = 0o600, 0o700


class AttemptLog:
    """An append-only log file that stops at `max_bytes`, saying so once. Thread-safe."""

    def __init__(self, path: Path | None, *, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.written = 0
        self.truncated = False
        self._lock = threading.Lock()
        self._fd: int | None = None
        if path is not None:
            try:
                self._fd = _open_log(str(path))
                self.written = os.fstat(self._fd).st_size
            except OSError as exc:  # no log beats no attempt; the worker's log says so
                logger.warning(
                    "cannot write the attempt's log; its output is dropped",
                    extra={"event": "attempt.log_unavailable", "path": str(path), "error": str(exc)},
                )

    def write(self, data: bytes) -> None:
        """Append `data`, or what fits under the cap followed by a truncation notice."""
        with self._lock:
            if self._fd is None or self.truncated or not data:
                return
            room = self.max_bytes - self.written
            if len(data) > room:
                notice = (
                    f"\n[treadle: this attempt's log reached its limit of {self.max_bytes} bytes "
                    "(TREADLE_LOG_MAX_BYTES); the rest of its output was dropped]\n"
                ).encode()
                data = data[: max(room, 0)] + notice
                self.truncated = True
            try:
                os.write(self._fd, data)
            except OSError:
                return
            self.written += len(data)

    def close(self) -> None:
        """Close the file (later writes are dropped)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _open_log(path: str) -> int:
    """Open (creating) a log file for appending, and its folders if they are missing: the file
    first, since a retry's folder exists already (plain os calls: this runs for every attempt)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    try:
        return os.open(path, flags, FILE_MODE)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=FOLDER_MODE, exist_ok=True)
        return os.open(path, flags, FILE_MODE)


def pump(
    source: int, log: AttemptLog, *, keep: bytearray | None = None, keep_bytes: int = 0
) -> threading.Thread:
    """Start a thread copying pipe `source` into `log` until EOF, then closing `source`; the last
    `keep_bytes` read are kept in `keep` too (a command's stderr tail)."""

    def copy() -> None:
        try:
            while chunk := os.read(source, CHUNK):
                log.write(chunk)
                if keep is not None:
                    keep.extend(chunk)
                    del keep[:-keep_bytes]
        except OSError:
            pass
        finally:
            os.close(source)

    thread = threading.Thread(target=copy, name="treadle-log-pump", daemon=True)
    thread.start()
    return thread


def _copy(source: int, log: AttemptLog) -> None:
    """Copy pipe `source` into `log` until EOF, then close `source`."""
    try:
        while chunk := os.read(source, CHUNK):
            log.write(chunk)
    except OSError:
        pass
    finally:
        os.close(source)


class _Pump:
    """One long-lived thread per task process copying each attempt's output pipe in turn.

    Starting a thread per attempt cost a task process about a tenth of its time per no-op
    attempt. Attempts in a task process run one at a time, so one thread serves them all; if an
    attempt's pipe is still held open past the drain (something the task started escaped
    containment), the next attempt gets a new thread and the old one finishes on its own.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[int, AttemptLog, threading.Event]] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._pid = os.getpid()
        threading.Thread(target=self._serve, name="treadle-log-pump", daemon=True).start()

    def usable(self) -> bool:
        """True in the process that started it, with no copy still going."""
        return self._pid == os.getpid() and self._idle.is_set()

    def copy(self, source: int, log: AttemptLog) -> threading.Event:
        """Copy `source` into `log`; the returned event is set once it reached EOF."""
        done = threading.Event()
        self._idle.clear()
        self._jobs.put((source, log, done))
        return done

    def _serve(self) -> None:
        while True:
            source, log, done = self._jobs.get()
            try:
                _copy(source, log)
            finally:
                done.set()
                self._idle.set()


_pump: _Pump | None = None


def _output_copier(source: int, log: AttemptLog) -> threading.Event:
    global _pump
    if _pump is None or not _pump.usable():
        _pump = _Pump()
    return _pump.copy(source, log)


@contextlib.contextmanager
def redirected_output(log: AttemptLog, *, before_drain: Callable[[], object] | None = None) -> Iterator[None]:
    """Point this process's fds 1 and 2 (and what its subprocesses inherit) at `log` meanwhile.

    On the way out Python's buffers are flushed, the fds restored, then `before_drain` runs
    (containment: whatever the task left running still holds the pipe, and what it reports
    belongs in the worker's log), then the copy is waited for (at most DRAIN_S).
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = os.dup(1), os.dup(2)
    reader, writer = os.pipe()
    os.set_inheritable(reader, False)
    copied = _output_copier(reader, log)
    os.dup2(writer, 1)
    os.dup2(writer, 2)
    os.close(writer)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        if before_drain is not None:
            before_drain()
        copied.wait(DRAIN_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFiles:
    """Where a worker's attempts keep their files, and the command allow-list, from the settings."""

    logs_dir: Path
    runs_dir: Path
    log_max_bytes: int
    command_allowlist: tuple[str, ...] = ()

    @staticmethod
    def of(settings: Settings) -> AttemptFiles:
        """From a process's settings."""
        return AttemptFiles(
            logs_dir=settings.logs_dir,
            runs_dir=settings.runs_dir,
            log_max_bytes=settings.log_max_bytes,
            command_allowlist=settings.command_allowlist,
        )

    def message_fields(self, task: ClaimedTask) -> dict[str, object]:
        """What a run request carries so the task process finds them (a mapped instance's log
        has its own folder)."""
        map_index = task.map_index
        path = attempt_log_path(
            self.logs_dir,
            dag_id=task.dag_id,
            run_id=task.run_id,
            task_id=task.task_id,
            map_index=map_index,
            attempt=task.attempt,
        )
        return {
            "log_path": str(path),
            "log_max_bytes": self.log_max_bytes,
            "runs_dir": str(self.runs_dir),
            "command_allowlist": list(self.command_allowlist),
        }
