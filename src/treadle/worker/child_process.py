"""A slot's task process: spawned, readied (DAG folder imported), killed with its group."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from treadle.errors import TreadleError
from treadle.worker.child import child_main
from treadle.worker.protocol import receive

log = logging.getLogger("treadle.worker")
_spawn = mp.get_context("spawn")
#: Times a slot spawns a child that dies before it is ready, before giving up.
SPAWN_TRIES = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildImports:
    """What a task process imports: the DAG folder, each file within a time limit, but not the
    files that the worker's last folder pass found slow (asked anew at each start)."""

    folder: Path
    max_result_bytes: int
    file_limit_s: float
    skip: Callable[[], Collection[str]]


class ChildProcess:
    """A spawned child running `child_main`; killed with its whole process group."""

    def __init__(self, imports: ChildImports) -> None:
        self.imports = imports
        self.conn: Connection | None = None
        self.process: Any = None
        self.start()

    def start(self) -> None:
        """Spawn the child and wait until it has imported the DAG folder.

        A child that dies before it is ready is spawned again (a signal sent to the worker's
        process group reaches a child still starting, before it has its own group), up to
        SPAWN_TRIES times; then the worker cannot run tasks and says why.
        """
        for attempt in range(1, SPAWN_TRIES + 1):
            parent, child = _spawn.Pipe()
            i = self.imports
            self.process = _spawn.Process(
                target=child_main,
                args=(child, str(i.folder), i.max_result_bytes, i.file_limit_s, sorted(i.skip())),
                daemon=True,
            )
            self.process.start()
            child.close()
            try:
                receive(parent)  # "ready" once the DAG folder is imported
            except (EOFError, OSError):
                parent.close()
                description = self.exit_description()
                log.warning(
                    "task process died while starting",
                    extra={"event": "worker.child_start_failed", "attempt": attempt, "exit": description},
                )
                if attempt == SPAWN_TRIES:
                    raise TreadleError(
                        f"a task process died while starting, {SPAWN_TRIES} times (last: {description})"
                    ) from None
                continue
            self.conn = parent
            return

    def kill(self) -> None:
        """Kill the child's process group (the task and anything it started)."""
        pid = self.process.pid
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.join(timeout=5)
        if self.conn is not None:
            self.conn.close()

    def signal_kill(self) -> None:
        """Kill the child's process group now, from any thread (the slot's thread then sees EOF)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def restart(self) -> None:
        """Replace a dead or killed child."""
        self.kill()
        self.start()

    def exit_description(self) -> str:
        """Describe how the child ended (after EOF on its pipe)."""
        self.process.join(timeout=2)
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"child process was killed by signal {signal.Signals(-code).name}"
        return f"child process exited with code {code}"
