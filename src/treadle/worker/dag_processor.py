"""Parse a DAG folder in a process of its own, with a time limit per file.

The worker and `treadle dags sync` never import DAG files themselves: a processor process
imports the folder (each file under the loader's own time limit) and sends back the serialized
structures, as Airflow's DAG processor does. It reports each file before importing it, so a file
stuck where no signal reaches (a C extension's loop) is known: past its limit the processor's
whole process group is killed, the file becomes a load error naming the limit, and a fresh
processor carries on with the files after it.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from treadle.authoring.loader import load_folder, time_limit_message
from treadle.domain.dag_version import DagStructure
from treadle.worker.protocol import receive, send

log = logging.getLogger("treadle.worker")
_spawn = mp.get_context("spawn")

#: Seconds a processor may take to start (spawn, import treadle) before its first report.
STARTUP_S = 60.0
#: Times a processor that dies before its first report is spawned.
START_TRIES = 3
#: Seconds a file may take beyond its limit (the loader's own signal ends it at the limit).
SLACK_S = 2.0


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


def parse_folder(folder: Path, *, file_limit_s: float) -> ParsedFolder:
    """Import `folder` in processor processes; every file gets `file_limit_s` (see the module)."""
    skip: dict[str, tuple[str, str]] = {}
    while True:
        parsed = _started_pass(folder, file_limit_s=file_limit_s, skip=skip)
        if isinstance(parsed, ParsedFolder):
            parsed.errors.update(skip)
            return parsed
        path, message = parsed
        skip[path] = (message, "")
        log.warning(
            "DAG file import killed", extra={"event": "dags.import_killed", "file": path, "why": message}
        )


def _started_pass(
    folder: Path, *, file_limit_s: float, skip: dict[str, tuple[str, str]]
) -> ParsedFolder | tuple[str, str]:
    """`_one_pass`, spawned again when the processor died before it started (a signal sent to
    the worker's process group reaches it before it has its own), up to START_TRIES times."""
    for attempt in range(1, START_TRIES + 1):
        try:
            return _one_pass(folder, file_limit_s=file_limit_s, skip=skip)
        except ProcessorDidNotStart as exc:
            if attempt == START_TRIES:
                raise RuntimeError(str(exc)) from None
            log.warning("DAG processor did not start; again", extra={"event": "dags.processor_restart"})
    raise AssertionError("unreachable")


class ProcessorDidNotStart(Exception):
    """The processor ended or hung before it reported anything."""


def _one_pass(
    folder: Path, *, file_limit_s: float, skip: dict[str, tuple[str, str]]
) -> ParsedFolder | tuple[str, str]:
    """Run one processor: the parsed folder, or the file it was on when it had to be killed or
    died, with the load error to record for it."""
    parent, child = _spawn.Pipe()
    process = _spawn.Process(
        target=processor_main, args=(child, str(folder), file_limit_s, sorted(skip)), daemon=True
    )
    process.start()
    child.close()
    current: str | None = None  # the file being imported, once the processor reported one
    try:
        while True:
            if not parent.poll(STARTUP_S if current is None else file_limit_s + SLACK_S):
                if current is None:
                    raise ProcessorDidNotStart(
                        f"the DAG processor for {folder} did not start within {STARTUP_S:g} s"
                    )
                return current, time_limit_message(current, file_limit_s) + " (the import was killed)"
            try:
                message = receive(parent)
            except (EOFError, OSError):
                process.join(timeout=5)
                if current is None:
                    raise ProcessorDidNotStart(
                        f"the DAG processor for {folder} exited before it started (code {process.exitcode})"
                    ) from None
                return (
                    current,
                    f"ProcessExit: importing {current} ended its process (exit code {process.exitcode})",
                )
            if "file" in message:
                current = message["file"]
                continue
            return _parsed(message)
    finally:
        _stop(process)
        parent.close()


def _parsed(message: dict[str, Any]) -> ParsedFolder:
    return ParsedFolder(
        structures={k: DagStructure.from_json(v) for k, v in message["structures"].items()},
        errors={f: (e[0], e[1]) for f, e in message["errors"].items()},
        files=list(message["files"]),
    )


def _stop(process: Any) -> None:  # Any: a multiprocessing Process
    if process.is_alive():
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.join(timeout=5)


def processor_main(conn: Connection, folder: str, file_limit_s: float, skip: list[str]) -> None:
    """Entry point of a processor process: own process group, import, send the structures."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    loaded = load_folder(
        Path(folder),
        time_limit_s=file_limit_s,
        skip=set(skip),
        on_file=lambda path: send(conn, {"file": path}),
    )
    send(
        conn,
        {
            "structures": {k: d.structure().to_json() for k, d in loaded.dags.items()},
            "errors": {f: [e.message, e.traceback] for f, e in loaded.errors.items()},
            "files": loaded.files,
        },
    )
