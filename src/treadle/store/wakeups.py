"""Wake-ups between the processes sharing one SQLite file: Unix datagram sockets.

SQLite has no NOTIFY. Every process that listens binds one datagram socket, named by its pid,
in a private folder beside the database file (`treadle.db-wakeups/`, mode 0700; under
`/tmp/treadle-wakeups-UID/` when that path is too long for a socket name). A transaction that
notified (`dialects.notify_ready` / `notify_cancel` record the channel on the connection) sends,
once it has committed, one byte per channel to every socket there, and calls the handlers of
its own process directly. Sends never block: a full receive queue already holds a wake-up, and a
socket nobody is bound to (its process died) is removed.

Like NOTIFY, a wake-up is a latency hint only: listeners keep polling, so a lost datagram costs
at most one poll. A folder that cannot be used (not creatable, not a folder, not private) means
polling alone, with one warning per process.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import sqlalchemy as sa

from treadle.store.dialects import CANCEL_CHANNEL, READY_CHANNEL, SCHEDULER_CHANNEL

log = logging.getLogger("treadle.store.wakeups")

#: The byte sent for each channel.
CHANNEL_BYTES = {READY_CHANNEL: b"R", CANCEL_CHANNEL: b"C", SCHEDULER_CHANNEL: b"S"}
_BYTE_CHANNELS = {b[0]: channel for channel, b in CHANNEL_BYTES.items()}
#: Longest socket path the kernel accepts (sun_path holds 108 bytes with the final NUL).
_MAX_SOCKET_PATH = 107
#: Room kept for the socket name (a pid) after the folder.
_PID_ROOM = len("/4194304")

Handlers = Mapping[str, Callable[[], None]]


def folder_for(url: str) -> Path | None:
    """The wake-up folder of a SQLite database URL (None: in-memory, or not SQLite)."""
    parsed = sa.engine.make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    path = Path(database).expanduser().resolve()
    folder = path.with_name(f"{path.name}-wakeups")
    if len(os.fsencode(folder)) + _PID_ROOM <= _MAX_SOCKET_PATH:
        return folder
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:20]
    return Path("/tmp") / f"treadle-wakeups-{os.getuid()}" / digest


class WakeupFolder:
    """One wake-up folder as this process sees it: sends, and the one socket it listens on."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._usable: bool | None = None
        self._registered: list[Handlers] = []
        self._sock: socket.socket | None = None
        self._sock_path: Path | None = None
        self._pid = 0
        self._sender: socket.socket | None = None

    # -- the folder ---------------------------------------------------------------------
    def usable(self) -> bool:
        """Create the folder if needed; False (with one warning) if it cannot be used."""
        with self._lock:
            if self._usable is None:
                problem = self._prepare()
                self._usable = problem is None
                if problem is not None:
                    log.warning(
                        "wake-ups between processes are off; workers and the scheduler poll",
                        extra={"event": "store.wakeups_off", "folder": str(self.folder), "why": problem},
                    )
            return self._usable

    def _prepare(self) -> str | None:
        """Why the folder cannot be used, or None once it exists, private and ours."""
        try:
            for level in (self.folder.parent, self.folder) if self._in_tmp else (self.folder,):
                try:
                    level.mkdir(mode=0o700)
                except FileExistsError:
                    pass
                info = os.lstat(level)
                if not stat.S_ISDIR(info.st_mode):
                    return f"{level} is not a folder"
                if info.st_uid != os.getuid():
                    return f"{level} belongs to another user"
                if info.st_mode & 0o077:
                    return f"{level} is open to other users (mode {stat.S_IMODE(info.st_mode):o}, want 700)"
            if not os.access(self.folder, os.W_OK | os.X_OK):
                return f"{self.folder} is not writable"
        except OSError as exc:
            return f"{self.folder}: {exc.strerror or exc}"
        return None

    @property
    def _in_tmp(self) -> bool:
        return self.folder.parent.name.startswith("treadle-wakeups-")

    # -- listening ----------------------------------------------------------------------
    def register(self, handlers: Handlers) -> bool:
        """Deliver wake-ups to `handlers` (binding this process's socket if it is the first)."""
        if not self.usable():
            return False
        with self._lock:
            if self._pid != os.getpid():  # a forked child: nothing of its parent's is its own
                self._registered, self._sock, self._sock_path = [], None, None
            if self._sock is None:
                bound = self._bind()
                if bound is None:
                    return False
                self._sock, self._sock_path = bound
                self._pid = os.getpid()
                threading.Thread(
                    target=self._serve, args=(self._sock,), name="treadle-wakeups", daemon=True
                ).start()
            self._registered.append(handlers)
        return True

    def unregister(self, handlers: Handlers) -> None:
        """Stop delivering to `handlers`; the last one out closes the socket."""
        with self._lock:
            if handlers in self._registered:
                self._registered.remove(handlers)
            if self._registered or self._sock is None:
                return
            sock, path = self._sock, self._sock_path
            self._sock = self._sock_path = None
        if path is not None:
            _unlink(path)
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in recv, which closes it
        except OSError:
            sock.close()

    def _bind(self) -> tuple[socket.socket, Path] | None:
        path = self.folder / str(os.getpid())
        _unlink(path)  # left by a dead process that had this pid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(str(path))
            os.chmod(path, 0o600)
        except OSError as exc:
            sock.close()
            log.warning(
                "cannot listen for wake-ups; polling only",
                extra={"event": "store.wakeups_off", "folder": str(self.folder), "why": str(exc)},
            )
            return None
        return sock, path

    def _serve(self, sock: socket.socket) -> None:
        """Receive datagrams and call the handlers of each channel named (once per batch)."""
        with sock:
            while True:
                try:
                    data = sock.recv(256)
                except OSError:
                    return
                if not data:  # shut down by unregister()
                    return
                channels = {_BYTE_CHANNELS.get(b) for b in data}
                sock.setblocking(False)
                try:
                    while True:
                        channels.update(_BYTE_CHANNELS.get(b) for b in sock.recv(256))
                except OSError:
                    pass
                finally:
                    sock.setblocking(True)
                with self._lock:
                    if self._sock is not sock:
                        return
                self._call_local(channels)

    def _call_local(self, channels: Iterable[str | None]) -> None:
        with self._lock:
            registered = list(self._registered) if self._pid == os.getpid() else []
        for channel in channels:
            for handlers in registered:
                handler = handlers.get(channel) if channel is not None else None
                if handler is None:
                    continue
                try:
                    handler()
                except Exception:
                    log.exception("wake-up handler failed", extra={"event": "store.wakeup_handler_error"})

    # -- sending ------------------------------------------------------------------------
    def publish(self, channels: Iterable[str]) -> None:
        """After a commit: wake this process's listeners and every other process's socket."""
        channels = sorted(set(channels))
        self._call_local(channels)
        payloads = [CHANNEL_BYTES[c] for c in channels if c in CHANNEL_BYTES]
        if not payloads:
            return
        try:
            names = os.listdir(self.folder)
        except OSError:
            return  # no folder: nobody listens (or they poll)
        own = str(os.getpid())
        for name in names:
            if name.isdigit() and name != own:
                self._send(self.folder / name, payloads)

    def _send(self, path: Path, payloads: list[bytes]) -> None:
        sender = self._sender
        if sender is None:
            with self._lock:
                if self._sender is None:
                    self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sender.setblocking(False)
                sender = self._sender
        for payload in payloads:
            try:
                sender.sendto(payload, str(path))
            except OSError as exc:
                if exc.errno == errno.ECONNREFUSED:
                    _remove_stale(path, sender, payload)
                    return
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                    continue  # its queue is full: it is awake already
                return  # ENOENT (it just went) and anything else: a hint lost, polling covers it


def _remove_stale(path: Path, sender: socket.socket, payload: bytes) -> None:
    """Remove a socket nobody is bound to (its process is gone), unless it was replaced meanwhile
    by a new process that got the same pid (which would then answer)."""
    try:
        inode = os.lstat(path).st_ino
        sender.sendto(payload, str(path))
        return
    except OSError as exc:
        if exc.errno != errno.ECONNREFUSED:
            return
    try:
        if os.lstat(path).st_ino == inode:
            path.unlink()
    except OSError:
        pass


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


_FOLDERS: dict[Path, WakeupFolder] = {}
_FOLDERS_LOCK = threading.Lock()


def for_url(url: str) -> WakeupFolder | None:
    """The process-wide WakeupFolder of a SQLite database (None where there can be none)."""
    folder = folder_for(url)
    if folder is None:
        return None
    with _FOLDERS_LOCK:
        found = _FOLDERS.get(folder)
        if found is None:
            found = _FOLDERS[folder] = WakeupFolder(folder)
        return found


def listen(folder: WakeupFolder, *, handlers: Handlers, stop: threading.Event) -> None:
    """SQLite's `notifications.listen`: call each channel's handler when it is notified, until
    `stop` is set. Calls every handler once at once, as a (re)connected LISTEN does."""
    if not folder.register(handlers):
        return
    try:
        for handler in handlers.values():
            handler()
        stop.wait()
    finally:
        folder.unregister(handlers)
