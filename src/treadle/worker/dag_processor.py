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
import multiprocessing as mp
import os
import signal
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
_spawn = mp.get_context("spawn")

#: Seconds a processor may take to start (spawn, import treadle) before it says it is ready.
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

    process: Any  # a multiprocessing Process
    conn: Connection
    #: Index + 1 of the file the processor is importing or last imported (0: none yet).
    progress: Any  # a multiprocessing RawValue("q")
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
        parent, child = _spawn.Pipe()
        progress = _spawn.RawValue("q", 0)
        process = _spawn.Process(
            target=processor_main,
            args=(child, str(self.folder), self.file_limit_s, progress),
            daemon=True,
        )
        process.start()
        child.close()
        return _Slot(process=process, conn=parent, progress=progress, started_at=time.monotonic())

    def _step(self) -> None:
        """Wait for a message, an exit or the next look; act on what each processor did."""
        waiting = [s.conn for s in self.slots] + [s.process.sentinel for s in self.slots]
        wait(waiting, timeout=WATCH_S)
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
        if not slot.process.is_alive():
            return self._replace(slot, died=True)
        now = time.monotonic()
        if not slot.ready:
            return slot if now - slot.started_at <= STARTUP_S else self._replace(slot, died=False)
        if not slot.batch:
            self._send_batch(slot)
        progress = slot.progress.value
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
        slot.seen, slot.seen_at = slot.progress.value, time.monotonic()
        send(slot.conn, {"files": [[i, self.files[i]] for i in slot.batch]})

    def _record(self, slot: _Slot, results: list[list[Any]]) -> None:
        for index, built, error in results:
            structures = [DagStructure.from_json(data) for data in built]
            self.results[self.files[index]] = (structures, None if error is None else (error[0], error[1]))
        slot.batch = []

    def _replace(self, slot: _Slot, *, died: bool) -> _Slot:
        """Kill the slot's processor; the file it was on becomes a load error, the rest of its
        batch goes back to the front of the queue; a fresh processor takes its place."""
        _close(slot)
        if not slot.ready:
            self.failed_starts += 1
            if self.failed_starts >= START_TRIES:
                how = "exited" if died else f"did not start within {STARTUP_S:g} s"
                raise ProcessorDidNotStart(
                    f"the DAG processor for {self.folder} {how} (code {slot.process.exitcode}), "
                    f"{START_TRIES} times"
                )
            log.warning("DAG processor did not start; again", extra={"event": "dags.processor_restart"})
        elif slot.batch:
            index = _current(slot)
            path = self.files[index]
            if died:
                code = slot.process.exitcode
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
    noted = slot.progress.value - 1
    return noted if noted in slot.batch else slot.batch[0]


def _close(slot: _Slot) -> None:
    """Kill the processor's process group (what its files started too), or the processor alone
    if it died before it had a group of its own."""
    if slot.process.is_alive():
        try:
            os.killpg(slot.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            slot.process.kill()
    slot.process.join(timeout=5)
    slot.conn.close()


def processor_main(conn: Connection, folder: str, file_limit_s: float, progress: Any) -> None:
    """Entry point of a processor process: own process group; import each batch of files it is
    sent, noting each file in `progress` before its import, and send back what each built."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    make_importable(Path(folder))
    send(conn, {"ready": True})
    while True:
        try:
            batch = receive(conn)
        except (EOFError, OSError):
            return
        results: list[list[Any]] = []
        for index, path in batch["files"]:
            progress.value = index + 1
            dags, error = load_file(Path(path), time_limit_s=file_limit_s)
            built = [d.structure().to_json() for d in dags]
            results.append([index, built, None if error is None else [error.message, error.traceback]])
        send(conn, {"results": results})
