"""SQLite wake-ups: datagrams sent after a commit (never on rollback) to every process listening
on the database's wake-up folder; stale sockets removed; an unusable folder means polling."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Connection

from tests.helpers.wait import wait_for
from treadle.store import dialects, wakeups
from treadle.store.database import Database
from treadle.store.notifications import listen


class Listening:
    """`listen` running in a thread with one Event per channel."""

    def __init__(self, url: str) -> None:
        self.ready, self.cancel = threading.Event(), threading.Event()
        self.stop = threading.Event()
        handlers = {dialects.READY_CHANNEL: self.ready.set, dialects.CANCEL_CHANNEL: self.cancel.set}
        self.thread = threading.Thread(
            target=listen, kwargs={"url": url, "handlers": handlers, "stop": self.stop}, daemon=True
        )
        self.thread.start()
        # listen() calls every handler once when it starts, as a fresh LISTEN does.
        wait_for(lambda: self.ready.is_set() and self.cancel.is_set(), message="the initial calls")
        self.ready.clear()
        self.cancel.clear()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def listening(sqlite_url: str) -> Iterator[Listening]:
    found = Listening(sqlite_url)
    yield found
    found.close()


def _notify_ready(conn: Connection) -> None:
    dialects.notify_ready(conn)


def test_the_folder_is_beside_the_file_or_under_tmp_when_the_path_is_too_long(tmp_path: Path) -> None:
    assert wakeups.folder_for(f"sqlite:///{tmp_path / 't.db'}") == tmp_path / "t.db-wakeups"
    assert wakeups.folder_for("sqlite://") is None
    assert wakeups.folder_for("sqlite:///:memory:") is None
    assert wakeups.folder_for("postgresql+psycopg://u@h/db") is None
    deep = tmp_path / ("x" * 100) / "t.db"
    folder = wakeups.folder_for(f"sqlite:///{deep}")
    assert folder is not None and folder.parent == Path(f"/tmp/treadle-wakeups-{os.getuid()}")
    assert folder == wakeups.folder_for(f"sqlite:///{deep}")  # every process derives the same


def test_a_commit_wakes_listeners_in_this_process_at_once_and_a_rollback_does_not(
    sqlite_url: str, listening: Listening
) -> None:
    db = Database(sqlite_url)
    try:
        assert db.supports_wakeups

        def notify_then_fail(conn: Connection) -> None:
            dialects.notify_ready(conn)
            raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            db.transact(notify_then_fail)
        assert not listening.ready.is_set()  # local delivery is synchronous: nothing was sent

        db.transact(_notify_ready)
        assert listening.ready.is_set() and not listening.cancel.is_set()
        db.transact(dialects.notify_cancel)
        assert listening.cancel.is_set()
    finally:
        db.dispose()


def test_a_commit_in_another_process_wakes_this_one(sqlite_url: str, listening: Listening) -> None:
    folder = wakeups.folder_for(sqlite_url)
    assert folder is not None and (folder / str(os.getpid())).exists()
    assert (os.stat(folder).st_mode & 0o777) == 0o700
    script = (
        "import sys\n"
        "from treadle.store import dialects\n"
        "from treadle.store.database import Database\n"
        "db = Database(sys.argv[1])\n"
        "db.transact(dialects.notify_ready)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, sqlite_url], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr

    wait_for(listening.ready.is_set, timeout=30, message="the wake-up from the other process")
    assert not listening.cancel.is_set()


def test_a_socket_nobody_is_bound_to_is_removed(sqlite_url: str, listening: Listening) -> None:
    folder = wakeups.folder_for(sqlite_url)
    assert folder is not None
    stale = folder / "4194000"  # what a killed process leaves behind
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(stale))
    dead.close()
    assert stale.exists()
    db = Database(sqlite_url)
    try:
        db.transact(_notify_ready)
    finally:
        db.dispose()
    assert not stale.exists()
    assert (folder / str(os.getpid())).exists()  # the live one stays


def test_the_last_listener_out_removes_its_socket(sqlite_url: str) -> None:
    found = Listening(sqlite_url)
    folder = wakeups.folder_for(sqlite_url)
    assert folder is not None and (folder / str(os.getpid())).exists()
    found.close()
    assert not found.thread.is_alive()
    assert not (folder / str(os.getpid())).exists()


@pytest.mark.parametrize("problem", ["a file", "open to others"])
def test_an_unusable_folder_means_polling_with_one_warning(
    sqlite_url: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = wakeups.folder_for(sqlite_url)
    assert folder is not None
    if problem == "a file":
        folder.write_text("not a folder")
    else:
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    caplog.set_level(logging.WARNING, logger="treadle.store.wakeups")
    db = Database(sqlite_url)
    try:
        assert not db.supports_wakeups
        assert not db.supports_wakeups
        stop = threading.Event()
        called: list[str] = []
        # Returns at once: the caller's poll is all there is.
        listen(db.url, handlers={dialects.READY_CHANNEL: lambda: called.append("ready")}, stop=stop)
        db.transact(_notify_ready)  # a commit that notifies still works
    finally:
        db.dispose()
    assert called == []
    warnings = [r for r in caplog.records if getattr(r, "event", "") == "store.wakeups_off"]
    assert len(warnings) == 1
