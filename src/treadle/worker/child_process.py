"""A slot's task process: forked by the worker's fork server (the DAG folder already imported),
readied, killed with its group.

The fork server (forkserver.py) is shared by every ChildProcess of one worker with the same
folder and limits: started by the first one, started again by the next start after it died,
and let go when the last one is killed for good. See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from treadle.errors import TreadleError
from treadle.worker.forkserver import ServerGone, ServerKey, ServerProcess, describe_exit, launch_server
from treadle.worker.protocol import receive

log = logging.getLogger("treadle.worker")
#: Times a slot starts a child that dies before it is ready (or whose fork server dies before
#: it answers), before giving up.
SPAWN_TRIES = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildImports:
    """What a task process imports: the DAG folder, each file within a time limit, but not the
    files that the worker's last folder pass found slow (asked anew at each start)."""

    folder: Path
    max_result_bytes: int
    file_limit_s: float
    skip: Callable[[], Collection[str]]


class SharedServer:
    """The fork server of one key: started on first use (or by `prestart`), started again the
    next time it is needed after it died."""

    def __init__(self, key: ServerKey) -> None:
        self.key = key
        self.users = 0
        self._lock = threading.Lock()
        self._current: ServerProcess | None = None
        self._began = 0.0
        #: Files a server of this key got stuck importing: its successors skip them.
        self.stuck: set[str] = set()

    def launch(self, skip: Collection[str]) -> None:
        """Start a server now if none runs (without waiting for it)."""
        with self._lock:
            if self._current is None or self._current.gone:
                self._launch(skip)

    def _launch(self, skip: Collection[str]) -> ServerProcess:
        self._began = time.monotonic()
        try:
            self._current = launch_server(self.key, skip, self.stuck)
        except OSError as exc:
            raise TreadleError(
                f"cannot start task processes: the fork server could not start: {exc}"
            ) from None
        return self._current

    def get(self, skip: Collection[str]) -> ServerProcess:
        """The running server, started if there is none.

        Raises ServerGone when it ended before it was ready, TreadleError when it said why it
        cannot start (a folder it cannot import at all).
        """
        with self._lock:
            current = self._current
            # Started ahead (prestart) before the slow files were known: it may be stuck in one.
            if (
                current is not None
                and not current.gone
                and not set(skip) <= current.skip
                and not current.wait_ready(0)
            ):
                current.kill()
                current.wait_ready()
            if current is not None and current.gone and current.ready:
                log.warning(
                    "fork server ended; starting another",
                    extra={"event": "worker.forkserver_died", "exit": current.describe()},
                )
            if current is None or current.gone:
                current = self._launch(skip)
            if not current.wait_ready():
                self._current = None
                why = current.describe()
                if current.failure is not None:
                    raise TreadleError(f"cannot start task processes: {why}")
                raise ServerGone(why)
            if self._began:
                log.info(
                    "fork server started",
                    extra={
                        "event": "worker.forkserver_started",
                        "pid": current.proc.pid,
                        "duration_s": round(time.monotonic() - self._began, 3),
                    },
                )
                self._began = 0.0
            return current

    @property
    def importing(self) -> str | None:
        """The DAG file the current server said it is importing (None: none, or no server)."""
        current = self._current
        if current is None:
            return None
        with current.cond:
            return current.importing

    @property
    def pid(self) -> int | None:
        """The current server's pid (None before the first start)."""
        current = self._current
        return None if current is None else current.proc.pid

    def close(self) -> None:
        """Let the server go (it exits once its socket closes); one still importing the folder
        is killed (a file stuck where no signal reaches would keep it from ever looking)."""
        with self._lock:
            current = self._current
            if current is None:
                return
            with current.cond:
                preloaded = current.preloaded
            if preloaded:
                current.close()
            else:
                current.kill()


_registry_lock = threading.Lock()
_servers: dict[ServerKey, SharedServer] = {}


def _acquire(key: ServerKey) -> SharedServer:
    with _registry_lock:
        shared = _servers.get(key)
        if shared is None:
            shared = _servers[key] = SharedServer(key)
        shared.users += 1
        return shared


def _release(shared: SharedServer) -> None:
    with _registry_lock:
        shared.users -= 1
        if shared.users > 0 or _servers.get(shared.key) is not shared:
            return
        del _servers[shared.key]
    shared.close()


def prestart(folder: Path, max_result_bytes: int, file_limit_s: float) -> None:
    """Start the fork server of these imports now, without waiting for it: it imports the DAG
    folder while the worker does other start-up work (its first task process uses it).

    Its skip list is empty (the slow files are not known yet): if the first task process asks
    for one with slow files to skip while it still imports, it is replaced by one that skips them.
    """
    imports = ChildImports(
        folder=folder, max_result_bytes=max_result_bytes, file_limit_s=file_limit_s, skip=lambda: ()
    )
    with _registry_lock:
        key = _key(imports)
        shared = _servers.get(key)
        if shared is None:
            shared = _servers[key] = SharedServer(key)
    shared.launch(())


def server_for(imports: ChildImports) -> SharedServer | None:
    """The fork server shared by task processes of `imports` (None when none is in use)."""
    with _registry_lock:
        return _servers.get(_key(imports))


def shutdown() -> None:
    """Let every fork server of this process go (their children are not touched)."""
    with _registry_lock:
        servers = list(_servers.values())
        _servers.clear()
    for shared in servers:
        shared.close()


def _forget_after_fork() -> None:
    """A forked copy of this process must not share its parent's servers."""
    global _registry_lock
    _registry_lock = threading.Lock()
    _servers.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _key(imports: ChildImports) -> ServerKey:
    return ServerKey(str(imports.folder), imports.max_result_bytes, imports.file_limit_s)


class ForkedProcess:
    """A task process as the worker sees it (the fork server is its parent and reaps it): pid,
    is_alive, join and exitcode, as multiprocessing.Process has them."""

    def __init__(self, pid: int, server: ServerProcess) -> None:
        self.pid = pid
        self._server = server
        #: Guards the pidfd: `close` may race a kill sent from another thread.
        self._lock = threading.Lock()
        self._pidfd: int | None = None
        self._status: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(pid)  # Linux: learn of its end without being its parent

    @property
    def exitcode(self) -> int | None:
        """Exit code, or minus the signal that killed it; None while it runs or if unknown."""
        status = self._status
        if status is None:
            with self._server.cond:
                status = self._server.exits.get(self.pid)
        return None if status is None else os.waitstatus_to_exitcode(status)

    def is_alive(self) -> bool:
        """False once it ended."""
        return not self._ended(0)

    def _ended(self, timeout: float) -> bool:
        if self.exitcode is not None:
            return True
        pidfd = self._pidfd
        if pidfd is not None:
            with contextlib.suppress(OSError, ValueError):  # closed meanwhile
                return bool(select.select([pidfd], [], [], timeout)[0])
        return not _process_exists(self.pid)

    def join(self, timeout: float | None = None) -> None:
        """Wait until it ended and its server said how (or its server is gone), within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._server.cond:
            while self.pid not in self._server.exits and not self._server.gone:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                self._server.cond.wait(left)
        if self.pid not in self._server.exits:  # the server is gone: wait for the process itself
            left = 1.0 if deadline is None else max(deadline - time.monotonic(), 0)
            self._ended(left)

    def send_signal(self, sig: int) -> None:
        """Signal the process itself (never another process that got its pid since)."""
        with self._lock, contextlib.suppress(OSError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif self.exitcode is None and _process_exists(self.pid):
                os.kill(self.pid, sig)

    def close(self) -> None:
        """Release what the worker holds for it (how it ended is kept)."""
        with self._lock:
            if self._pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._pidfd)
                self._pidfd = None
        with self._server.cond:
            status = self._server.exits.pop(self.pid, None)
        if status is not None:
            self._status = status


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ChildProcess:
    """A forked child serving `child.serve`; killed with its whole process group."""

    process: ForkedProcess

    def __init__(self, imports: ChildImports) -> None:
        self.imports = imports
        self.conn: Connection | None = None
        self._shared: SharedServer | None = None
        self._process: ForkedProcess | None = None
        try:
            self.start()
        except BaseException:
            self._release()
            raise

    def start(self) -> None:
        """Fork a child from the fork server and wait until it is ready.

        The skip list is read anew. A child that dies before it is ready (a signal sent to its
        group) or whose fork server dies before it answers is started again, up to SPAWN_TRIES
        times; then the worker cannot run tasks and says why.
        """
        if self._shared is None:
            self._shared = _acquire(_key(self.imports))
        for attempt in range(1, SPAWN_TRIES + 1):
            skip = sorted(self.imports.skip())
            mine, theirs = socket.socketpair()
            try:
                server = self._shared.get(skip)
                pid = server.fork(theirs.fileno(), skip)
            except ServerGone as gone:
                mine.close()
                self._failed_start(attempt, str(gone))
                continue
            except BaseException:
                mine.close()
                raise
            finally:
                theirs.close()
            self._set_process(ForkedProcess(pid, server))
            parent = Connection(mine.detach())
            try:
                receive(parent)  # "ready": in its own group, watching the worker
            except (EOFError, OSError):
                parent.close()
                self._failed_start(attempt, self.exit_description())
                continue
            self.conn = parent
            return

    def _failed_start(self, attempt: int, description: str) -> None:
        log.warning(
            "task process could not start",
            extra={"event": "worker.child_start_failed", "attempt": attempt, "exit": description},
        )
        if attempt == SPAWN_TRIES:
            raise TreadleError(f"a task process could not start, {SPAWN_TRIES} times (last: {description})")

    def _set_process(self, process: ForkedProcess) -> None:
        if self._process is not None:
            self._process.close()
        self._process = self.process = process

    def kill(self) -> None:
        """Kill the child's process group (the task and anything it started), for good: a later
        `restart()` starts a new one."""
        self._kill_process()
        if self._process is not None:
            self._process.close()
        self._release()

    def _kill_process(self) -> None:
        if self._process is not None:
            self.signal_kill()
            self._process.join(timeout=5)
        if self.conn is not None:
            self.conn.close()

    def _release(self) -> None:
        if self._shared is not None:
            _release(self._shared)
            self._shared = None

    def signal_kill(self) -> None:
        """Kill the child's process group now, from any thread (the slot's thread then sees EOF)."""
        process = self._process
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # not yet its own group (still starting): the process alone
            process.send_signal(signal.SIGKILL)
        except PermissionError:
            pass

    def restart(self) -> None:
        """Replace a dead or killed child."""
        self._kill_process()
        self.start()

    def exit_description(self) -> str:
        """Describe how the child ended (after EOF on its pipe)."""
        process = self.process
        process.join(timeout=2)
        code = process.exitcode
        if code is None and not process.is_alive():
            return "child process ended; its exit status is unknown (its fork server ended first)"
        if code is not None and code < 0:
            return describe_exit(code, "child process")
        return f"child process exited with code {code}"
