"""Parse a DAG folder in processes of their own, with a time limit per file.

The worker and `treadle dags sync` never import DAG files themselves: processor processes
import the folder (each file under the loader's own time limit) and send back the serialized
structures, as Airflow's DAG processor does. A large folder is shared among as many processors
as the machine has cores: the parent lists the files and hands each processor a batch of them
at a time, and merges what they found in file order, so the result is the one a single process
importing the files one after the other would give (a DAG id defined twice is an error on the
later file).

A processor notes in shared memory which file it is importing before it starts it, so a file
stuck where no signal reaches (a C extension's loop) is known without a message per file: past
its limit the processor's whole process group is killed, the file becomes a load error naming
the limit, and a fresh processor takes the rest of its batch. A file that ends its process is a
load error too.
"""

from __future__ import annotations

import logging
import math
import mmap
import multiprocessing
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from treadle.authoring.loader import dag_files, load_file, make_importable, time_limit_message
from treadle.domain.dag_version import DagStructure
from treadle.worker.protocol import receive, send

log = logging.getLogger("treadle.worker")

_BOOT = "from treadle.worker.dag_processor import serve; serve()"
#: The progress a processor notes: index + 1 of the file it is importing (0: none yet).
_PROGRESS = struct.Struct("q")

#: Seconds a processor may take to start (an interpreter importing treadle) before it says it
#: is ready.
STARTUP_S = 60.0
#: Times in a row a processor that dies or hangs before it is ready is spawned.
START_TRIES = 3
#: Seconds a file may take beyond its limit (the loader's own signal ends it at the limit).
SLACK_S = 2.0
#: Files per processor below which another processor costs more to start than it saves
#: (starting one, an interpreter importing treadle, takes about as long as importing this many
#: small DAG files).
FILES_PER_PROCESSOR = 200
#: Most files in one batch: a batch's structures come back in one message.
MAX_BATCH = 100
#: Seconds between two looks at the processors' progress while none sends anything.
WATCH_S = 0.1


@dataclass(slots=True)
class ParsedFolder:
    """What a pass over a DAG folder found: structures by DAG id, errors by file, files seen."""

    structures: dict[str, DagStructure] = field(default_factory=dict)
    errors: dict[str, tuple[str, str]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @property
    def timed_out(self) -> frozenset[str]:
        """Files that did not import within the time limit (task processes skip them)."""
        return frozenset(
            f for f, (message, _) in self.errors.items() if message.startswith("DagImportTimeout")
        )


#: What importing one file gave: the structures it built, or its error.
FileResult = tuple[list[DagStructure], tuple[str, str] | None]


def processor_count(files: int) -> int:
    """How many processors import `files` files: one per core the process may use, and no more
    than one per FILES_PER_PROCESSOR files."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, math.ceil(files / FILES_PER_PROCESSOR)))


def parse_folder(folder: Path, *, file_limit_s: float, processes: int | None = None) -> ParsedFolder:
    """Import `folder` in processor processes (`processes` of them, or `processor_count`); every
    file gets `file_limit_s` (see the module)."""
    files = [str(p) for p in dag_files(folder)]
    count = processor_count(len(files)) if processes is None else max(1, min(processes, len(files)))
    results = _Pool(folder, files, file_limit_s=file_limit_s, count=count).run() if files else {}
    return _merged(files, results)


def _merged(files: list[str], results: dict[str, FileResult]) -> ParsedFolder:
    """The files' results in file order, as one process importing them in turn finds them."""
    parsed = ParsedFolder(files=files)
    for path in files:
        built, error = results[path]
        if error is not None:
            parsed.errors[path] = error
            continue
        for structure in built:
            if structure.dag_id in parsed.structures:
                other = parsed.structures[structure.dag_id].fileloc
                parsed.errors[path] = (
                    f"DagDefinitionError: duplicate dag id {structure.dag_id!r} (also in {other})",
                    "",
                )
                continue
            parsed.structures[structure.dag_id] = structure
    return parsed


class ProcessorDidNotStart(RuntimeError):
    """A processor ended or hung before it said it was ready."""


@dataclass(slots=True)
class _Slot:
    """One processor process and the batch it is importing."""

    process: subprocess.Popen[bytes]
    conn: Connection
    #: Shared with the processor: index + 1 of the file it is importing or last imported.
    progress: mmap.mmap
    started_at: float
    ready: bool = False
    #: Indexes of the files of the batch sent and not yet answered.
    batch: list[int] = field(default_factory=list)
    #: The progress last seen, and when it was first seen.
    seen: int = 0
    seen_at: float = 0.0


class _Pool:
    """Processors importing the files, a batch at a time each, until every file has a result."""

    def __init__(self, folder: Path, files: list[str], *, file_limit_s: float, count: int) -> None:
        self.folder = folder
        self.files = files
        self.file_limit_s = file_limit_s
        self.count = count
        self.todo: deque[int] = deque(range(len(files)))
        self.results: dict[str, FileResult] = {}
        self.slots: list[_Slot] = []
        self.failed_starts = 0

    def run(self) -> dict[str, FileResult]:
        try:
            for _ in range(self.count):
                self.slots.append(self._start())
            while len(self.results) < len(self.files):
                self._step()
            return self.results
        finally:
            for slot in self.slots:
                _close(slot)

    def _start(self) -> _Slot:
        """Start a processor: a fresh interpreter (not a fork of this process, and nothing of
        this process's `__main__` imported again), leading a process group of its own. It reads
        the DAG files' `__pycache__` but writes none (`-B`): creating 10,000 bytecode files cost
        a first sync more than compiling them did."""
        mine, theirs = multiprocessing.Pipe()
        with tempfile.TemporaryFile() as shared:
            shared.truncate(_PROGRESS.size)
            progress = mmap.mmap(shared.fileno(), _PROGRESS.size)
            try:
                process = subprocess.Popen(
                    [sys.executable, "-B", "-c", _BOOT, str(theirs.fileno()), str(shared.fileno())],
                    pass_fds=[theirs.fileno(), shared.fileno()],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError:
                mine.close()
                progress.close()
                raise
            finally:
                theirs.close()
        slot = _Slot(process=process, conn=mine, progress=progress, started_at=time.monotonic())
        try:
            send(mine, {"folder": str(self.folder), "file_limit_s": self.file_limit_s, "sys_path": sys.path})
        except OSError:
            pass  # it is gone already: the next look says so
        return slot

    def _step(self) -> None:
        """Wait for a message or the next look; act on what each processor did."""
        wait([s.conn for s in self.slots], timeout=WATCH_S)
        for n, slot in enumerate(self.slots):
            self.slots[n] = self._tend(slot)

    def _tend(self, slot: _Slot) -> _Slot:
        """The slot after reading its messages and checking its processor: itself, or a fresh
        processor in place of one that had to be killed or died."""
        while slot.conn.poll():
            try:
                message = receive(slot.conn)
            except (EOFError, OSError):
                return self._replace(slot, died=True)
            if "ready" in message:
                slot.ready = True
                self.failed_starts = 0
            else:
                self._record(slot, message["results"])
        if slot.process.poll() is not None:
            return self._replace(slot, died=True)
        now = time.monotonic()
        if not slot.ready:
            return slot if now - slot.started_at <= STARTUP_S else self._replace(slot, died=False)
        if not slot.batch:
            self._send_batch(slot)
        progress = _noted(slot)
        if progress != slot.seen:
            slot.seen, slot.seen_at = progress, now
        if slot.batch and now - slot.seen_at > self.file_limit_s + SLACK_S:
            return self._replace(slot, died=False)
        return slot

    def _send_batch(self, slot: _Slot) -> None:
        """Hand the slot its next files: a share of what is left, so the processors finish
        together, and at most MAX_BATCH."""
        if not self.todo:
            return
        size = max(1, min(MAX_BATCH, len(self.todo) // (2 * self.count)))
        slot.batch = [self.todo.popleft() for _ in range(min(size, len(self.todo)))]
        slot.seen, slot.seen_at = _noted(slot), time.monotonic()
        send(slot.conn, {"files": [[i, self.files[i]] for i in slot.batch]})

    def _record(self, slot: _Slot, results: list[list[Any]]) -> None:
        for index, built, error in results:
            structures = [DagStructure.from_json(data) for data in built]
            self.results[self.files[index]] = (structures, None if error is None else (error[0], error[1]))
        slot.batch = []

    def _replace(self, slot: _Slot, *, died: bool) -> _Slot:
        """Kill the slot's processor; the file it was on becomes a load error, the rest of its
        batch goes back to the front of the queue; a fresh processor takes its place."""
        index = _current(slot) if slot.ready and slot.batch else None
        _close(slot)
        if not slot.ready:
            self.failed_starts += 1
            if self.failed_starts >= START_TRIES:
                how = "exited" if died else f"did not start within {STARTUP_S:g} s"
                raise ProcessorDidNotStart(
                    f"the DAG processor for {self.folder} {how} (code {slot.process.returncode}), "
                    f"{START_TRIES} times"
                )
            log.warning("DAG processor did not start; again", extra={"event": "dags.processor_restart"})
        elif index is not None:
            path = self.files[index]
            if died:
                code = slot.process.returncode
                message = f"ProcessExit: importing {path} ended its process (exit code {code})"
            else:
                message = time_limit_message(path, self.file_limit_s) + " (the import was killed)"
            log.warning(
                "DAG file import killed",
                extra={"event": "dags.import_killed", "file": path, "why": message},
            )
            self.results[path] = ([], (message, ""))
            self.todo.extendleft(reversed([i for i in slot.batch if i != index]))
        return self._start()


def _current(slot: _Slot) -> int:
    """The file of the slot's batch its processor was on: the one it noted (after the batch's
    last import, while it sends the results, still that file), else the batch's first (it had
    not begun the batch)."""
    noted = _noted(slot) - 1
    return noted if noted in slot.batch else slot.batch[0]


def _noted(slot: _Slot) -> int:
    value: int = _PROGRESS.unpack_from(slot.progress)[0]
    return value


def _close(slot: _Slot) -> None:
    """Kill the processor's process group: the processor, if it still runs, and whatever its
    files started."""
    try:
        os.killpg(slot.process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        slot.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("DAG processor did not end", extra={"event": "dags.processor_lingers"})
    slot.conn.close()
    slot.progress.close()


def serve() -> None:
    """Entry point of a processor process, `python -c ... CONN PROGRESS` (the file descriptors of
    its end of the pipe and of the shared progress): import each batch of files it is sent,
    noting each file in the progress before its import, and send back what each built."""
    conn = Connection(int(sys.argv[1]))
    progress = mmap.mmap(int(sys.argv[2]), _PROGRESS.size)
    os.close(int(sys.argv[2]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        config = receive(conn)
    except (EOFError, OSError):
        return
    sys.path[:] = config["sys_path"]
    file_limit_s = float(config["file_limit_s"])
    make_importable(Path(config["folder"]))
    send(conn, {"ready": True})
    while True:
        try:
            batch = receive(conn)
        except (EOFError, OSError):
            return
        results: list[list[Any]] = []
        for index, path in batch["files"]:
            _PROGRESS.pack_into(progress, 0, index + 1)
            dags, error = load_file(Path(path), time_limit_s=file_limit_s)
            built = [d.structure().to_json() for d in dags]
            results.append([index, built, None if error is None else [error.message, error.traceback]])
        send(conn, {"results": results})
