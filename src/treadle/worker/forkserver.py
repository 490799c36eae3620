"""The fork server: one clean process per worker and DAG folder that imports treadle's task-side
code and the DAG folder once, then forks a task process for each slot that asks.

Children of one server share its imported pages copy-on-write, so a task process costs what it
writes, not a whole interpreter with every DAG imported, and starting one is a fork (a few ms),
not an interpreter start and a folder import.

The server is started with `subprocess` (a fresh interpreter, never a fork of the worker: user
DAG code is imported here, and forking a process that runs the worker's threads is unsafe) in a
session of its own, so signals aimed at the worker's process group (a terminal's Ctrl-C) do not
reach it. It stays single-threaded. It talks to the worker over a Unix SEQPACKET socket (one
message per request or event, JSON; file descriptors travel alongside with SCM_RIGHTS):

    worker -> server  {"folder", "max_result_bytes", "file_limit_s", "skip", "sys_path"}  (first)
    server -> worker  {"op": "ready"}  or  {"op": "failed", "error": "..."}
    server -> worker  {"op": "importing", "file": PATH}  (before each file it imports)
    server -> worker  {"op": "preloaded"}  (the whole folder is imported)
    worker -> server  {"op": "fork", "id": N, "skip": [...]}  + the child's end of its pipe
    server -> worker  {"op": "forked", "id": N, "pid": PID}
    server -> worker  {"op": "exited", "pid": PID, "status": WAITSTATUS}  (it reaps its children)

The server says it is ready before it imports anything, then imports the folder one file at a
time (each within the time limit), looking for requests between two files (it starts once no
fork was asked for PRELOAD_QUIET_S, so a starting worker's slots never wait for a file): a fork
asked for meanwhile is served before the next file, with the files imported so far, and its
child imports the one file an attempt needs when it needs it (DagCache.get with the DAG's
file). So a worker starts its task processes and claims without waiting for the folder, however
large, and children still share the imports of the files the server had. Once the folder is
in, before each fork the server brings its imports up to date with the folder (files whose size
or mtime changed are imported again; files in the request's skip list are left out), so a fresh
child starts with the current code. A child checks each attempt's
version hash anyway (DagCache), so even a child forked from older imports never runs stale code.

The server ends when the worker's end of the socket closes (the worker ended or let it go).
Its children do not depend on it: each watches its own pipe to the worker (see
child.forked_child_main), so a server that dies takes no running attempt with it; the worker
starts a new one the next time it needs a child.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from treadle.worker.child import DagCache

#: Largest control message (a fork request carries the skip list).
MAX_MESSAGE = 1 << 20
#: Seconds a file may take beyond its limit before the server counts as stuck in it (the
#: loader's own signal ends a Python import at the limit).
SLACK_S = 2.0

#: Seconds without a fork request before the server imports the next file of the folder ahead
#: of need, once it has forked a child; and before it has, since it became ready.
PRELOAD_QUIET_S = 0.3
PRELOAD_FIRST_WAIT_S = 2.0

_BOOT = "from treadle.worker.forkserver import serve; serve()"


class ServerGone(Exception):
    """The fork server ended before it answered."""


# --- the server process ---------------------------------------------------------------------


def serve() -> None:
    """Entry point of the server process: `python -c ... FD` with FD its end of the socket."""
    ctl = socket.socket(fileno=int(sys.argv[1]))
    ctl.set_inheritable(False)
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        config = _receive(ctl)[0]
        if config is None:
            return
        sys.path[:] = config["sys_path"]
        from treadle.worker.child import DagCache, forked_child_main

        cache = DagCache(
            Path(config["folder"]),
            file_limit_s=config["file_limit_s"],
            skip=config["skip"],
            on_file=lambda path: _send(ctl, {"op": "importing", "file": path}),
            lazy=True,
        )
    except BaseException as exc:
        with contextlib.suppress(OSError):
            _send(ctl, {"op": "failed", "error": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()
        raise SystemExit(1) from None
    # Reaped in the handler, which Python runs between bytecodes: also while the server imports
    # a file. A SEQPACKET message is sent whole, so its report never splits another message.
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: _reap(ctl))
    _send(ctl, {"op": "ready"})
    forks, last_request = 0, time.monotonic()
    while True:
        if cache.preloading:
            # The first forks (a starting worker's slots) come before any file: a file that takes
            # long to import would hold them. Then one file at a time, looking for requests between.
            quiet_s = (PRELOAD_QUIET_S if forks else PRELOAD_FIRST_WAIT_S) - (time.monotonic() - last_request)
            if not _readable(ctl, max(quiet_s, 0.0)):
                cache.preload_next()
                if not cache.preloading:
                    _send(ctl, {"op": "preloaded"})
                continue
        request, fds = _receive(ctl)
        last_request = time.monotonic()
        if request is None:  # the worker is gone or let us go
            return
        if request.get("op") != "fork" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        _bring_up_to_date(cache, frozenset(request.get("skip") or ()))
        gc.freeze()  # what exists now is shared: the children's collections never touch it
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                ctl.close()
                cache.on_file = None  # its reports went to the worker over `ctl`
                forked_child_main(fds[0], cache, config["max_result_bytes"])
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(fds[0])
        forks += 1
        _send(ctl, {"op": "forked", "id": request["id"], "pid": pid})


def _bring_up_to_date(cache: DagCache, skip: frozenset[str]) -> None:
    """Before a fork: the folder's current code, but `skip`. While the folder is still being
    imported, the child is forked with what is imported so far (it imports what it needs)."""
    if cache.preloading:
        cache.skip = skip
        cache.pending = [path for path in cache.pending if path not in skip]
    else:
        cache.refresh(skip)


def _readable(sock: socket.socket, timeout_s: float) -> bool:
    """Whether a message (or the end of the stream) waits on `sock`, within `timeout_s`."""
    return bool(select.select([sock], [], [], timeout_s)[0])


def _reap(ctl: socket.socket) -> None:
    """Collect every child that ended and tell the worker how each ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):  # the worker is gone: the main loop sees it next
            _send(ctl, {"op": "exited", "pid": pid, "status": status})


def _send(sock: socket.socket, message: dict[str, Any], fds: Collection[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors sent with it; (None, []) at end of file."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    message: dict[str, Any] = json.loads(data)
    return message, fds


# --- the worker's side ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerKey:
    """What a server's imports depend on: one server per worker and key."""

    folder: str
    max_result_bytes: int
    file_limit_s: float | None


@dataclass(slots=True, eq=False)
class ServerProcess:
    """One server process and what it reported (seen from the worker)."""

    proc: subprocess.Popen[bytes]
    ctl: socket.socket
    #: The skip list it imported the folder with.
    skip: frozenset[str]
    #: Files that froze a server of this key (shared with its successors, which skip them).
    stuck: set[str]
    file_limit_s: float | None
    cond: threading.Condition = field(default_factory=threading.Condition)
    #: Sending never holds `cond`: the reader must always be able to drain the socket.
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    ready: bool = False
    #: Set once it imported the whole folder (it is ready, and forks, before that).
    preloaded: bool = False
    #: Why it could not start, as it said so itself.
    failure: str | None = None
    replies: dict[int, int] = field(default_factory=dict)
    #: Wait statuses of its children that ended, by pid.
    exits: dict[int, int] = field(default_factory=dict)
    gone: bool = False
    next_id: int = 0
    #: The file it said it is importing, since when (monotonic), and the one it froze on.
    importing: str | None = None
    importing_since: float = 0.0
    froze: str | None = None

    def read_loop(self) -> None:
        """Runs in a thread of its own: take the server's messages until it ends."""
        try:
            while True:
                message, fds = _receive(self.ctl)
                for fd in fds:
                    os.close(fd)
                if message is None:
                    break
                with self.cond:
                    op = message.get("op")
                    if op == "forked":
                        self.replies[int(message["id"])] = int(message["pid"])
                        self.importing = None
                    elif op == "exited":
                        self.exits[int(message["pid"])] = int(message["status"])
                    elif op == "importing":
                        self.importing, self.importing_since = str(message["file"]), time.monotonic()
                    elif op == "ready":
                        self.ready = True
                        self.importing = None
                    elif op == "preloaded":
                        self.preloaded = True
                        self.importing = None
                    elif op == "failed":
                        self.failure = str(message.get("error"))
                    self.cond.notify_all()
        except (OSError, ValueError):
            pass
        with self.cond:
            self.gone = True
            self.cond.notify_all()
        with contextlib.suppress(OSError):
            self.ctl.close()
        try:
            self.proc.wait(timeout=30)  # it exits on its own once the socket closed
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once it has imported the folder; False if it ended first (or `timeout` passed)."""
        with self.cond:
            self._wait(lambda: self.ready, timeout)
            return self.ready and not self.gone

    def _wait(self, done: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait (holding `cond`) until `done()`, the server's end, or `timeout`.

        A server importing one file for longer than the time limit (plus slack) is stuck where
        no signal reaches: it is killed, and its successors skip that file.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done() and not self.gone:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            self.cond.wait(1.0 if left is None else min(left, 1.0))
            if (
                self.importing is not None
                and self.file_limit_s is not None
                and self.froze is None
                and time.monotonic() - self.importing_since > self.file_limit_s + SLACK_S
            ):
                self.froze = self.importing
                self.stuck.add(self.importing)
                self.kill()

    def fork(self, child_end: int, skip: Collection[str]) -> int:
        """Ask for a child that serves `child_end`; returns its pid (raises ServerGone)."""
        with self.send_lock:
            self.next_id += 1
            request_id = self.next_id
            request = {"op": "fork", "id": request_id, "skip": sorted(set(skip) | self.stuck)}
            try:
                _send(self.ctl, request, [child_end])
            except OSError:
                raise ServerGone(self.describe()) from None
        with self.cond:
            self._wait(lambda: request_id in self.replies)
            pid = self.replies.pop(request_id, None)
        if pid is None:
            raise ServerGone(self.describe())
        return pid

    def describe(self) -> str:
        """How the server ended (or that it still runs), with what it said about it."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        ended = describe_exit(self.proc.returncode, "the fork server")
        if self.froze is not None:
            limit = self.file_limit_s or 0
            return f"{ended}: it was stuck importing {self.froze} (longer than {limit:g} s)"
        return ended if self.failure is None else f"{ended}: {self.failure}"

    def close(self) -> None:
        """Let the server go: it exits once it sees its socket close."""
        with contextlib.suppress(OSError):
            self.ctl.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        """End the server now (its children are not touched)."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.close()


def describe_exit(code: int | None, what: str) -> str:
    """'<what> exited with code N' / 'was killed by signal NAME' (code as subprocess gives it)."""
    if code is None:
        return f"{what} is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"{what} was killed by signal {name}"
    return f"{what} exited with code {code}"


def launch_server(key: ServerKey, skip: Collection[str], stuck: set[str]) -> ServerProcess:
    """Start a server process that imports the DAG folder but `skip` and `stuck` (see
    `wait_ready`); files it gets stuck in are added to `stuck`.

    Raises OSError when the process cannot be created.
    """
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
    except OSError:
        mine.close()
        raise
    finally:
        theirs.close()
    config = {
        "folder": key.folder,
        "max_result_bytes": key.max_result_bytes,
        "file_limit_s": key.file_limit_s,
        "skip": sorted(set(skip) | stuck),
        "sys_path": list(sys.path),
    }
    server = ServerProcess(
        proc=proc, ctl=mine, skip=frozenset(skip), stuck=stuck, file_limit_s=key.file_limit_s
    )
    with contextlib.suppress(OSError):  # if it is gone already, the reader says so
        _send(mine, config)
    threading.Thread(target=server.read_loop, name="treadle-forkserver-reader", daemon=True).start()
    return server
