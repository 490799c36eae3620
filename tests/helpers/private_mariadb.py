"""A MariaDB server of one test's own, to restart and kill without touching the shared one.

`mariadb-install-db` into a fresh data folder, then `mariadbd` on a free port of 127.0.0.1 with
a socket, pid file and error log in the same temporary folder. No option file is read
(`--no-defaults`), so the machine's server settings (port 3306, its socket) never leak in.
`root` logs in without a password. As root the server runs with `--user=root` (mariadbd
refuses root otherwise); the files stay in the temporary folder and are removed by `close()`.

The server is a child of the test process in a session of its own (a signal to the test's
process group never reaches it), and it gets SIGKILL if the test process dies without
`close()`, so no server outlives a crashed or timed-out test run.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pymysql

#: Small and quick: a throwaway server with a few MB of data.
_SERVER_OPTIONS = (
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=2",  # no fsync per commit; kill -9 still recovers (OS cache)
    "--skip-name-resolve",
    "--skip-log-bin",
    "--character-set-server=utf8mb4",  # as Debian's packaged server is configured
    "--collation-server=utf8mb4_general_ci",
)

_PR_SET_PDEATHSIG = 1


def find_binaries() -> tuple[Path, Path] | None:
    """(install tool, server) if MariaDB (or MySQL's older names) is installed, else None."""
    install = next(
        (
            Path(p)
            for p in (shutil.which("mariadb-install-db"), shutil.which("mysql_install_db"))
            if p is not None
        ),
        None,
    )
    server = next(
        (
            Path(p)
            for p in (
                "/usr/sbin/mariadbd",
                "/usr/sbin/mysqld",
                shutil.which("mariadbd"),
                shutil.which("mysqld"),
            )
            if p is not None and Path(p).exists()
        ),
        None,
    )
    return (install, server) if install and server else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child before exec: a new session, and SIGKILL when the test process dies."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class PrivateMariaDB:
    """One throwaway MariaDB server; `close()` stops it and removes its files."""

    def __init__(self, *, start_timeout: float = 90.0) -> None:
        found = find_binaries()
        if found is None:
            raise FileNotFoundError("mariadb-install-db or mariadbd not found (install mariadb-server)")
        self.install_tool, self.server = found
        self.start_timeout = start_timeout
        self.root = Path(tempfile.mkdtemp(prefix="treadle-mariadb-"))
        self.data = self.root / "data"
        self.socket = self.root / "mariadb.sock"
        self.pid_file = self.root / "mariadb.pid"
        self.error_log = self.root / "error.log"
        self.port = _free_port()
        self._user = ["--user=root"] if os.geteuid() == 0 else []
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            subprocess.run(
                [
                    str(self.install_tool),
                    "--no-defaults",
                    f"--datadir={self.data}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    *self._user,
                    *_SERVER_OPTIONS,
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            self.start()
        except BaseException:
            self.close()
            raise

    def url(self, db: str = "mysql") -> str:
        """The URL of database `db` over TCP, as treadle takes it."""
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{db}"

    def connect(self, db: str | None = None) -> pymysql.connections.Connection[pymysql.cursors.Cursor]:
        """An autocommit admin connection as root."""
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            password="",
            database=db,
            autocommit=True,
            connect_timeout=5,
        )

    def create_database(self, name: str) -> str:
        """`CREATE DATABASE name` with the server's defaults; returns its URL."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
        return self.url(name)

    @property
    def running(self) -> bool:
        """True while the server process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.proc is not None, "the server was never started"
        return self.proc.pid

    def start(self) -> None:
        """Start the server on the same port and data folder; wait until it accepts connections."""
        assert not self.running, "the server is running"
        with self.error_log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(self.server),
                    "--no-defaults",
                    f"--datadir={self.data}",
                    "--bind-address=127.0.0.1",
                    f"--port={self.port}",
                    f"--socket={self.socket}",
                    f"--pid-file={self.pid_file}",
                    f"--log-error={self.error_log}",
                    f"--tmpdir={self.root}",
                    *self._user,
                    *_SERVER_OPTIONS,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # the server is started from the main thread only
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if not self.running:
                raise RuntimeError(f"mariadbd exited at start:\n{self.log_tail()}")
            try:
                with self.connect() as conn, conn.cursor() as cur:
                    cur.execute("SELECT 1")
                return
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"mariadbd not ready after {self.start_timeout}s:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.1)

    def stop(self, mode: str = "fast", *, timeout: float = 90.0) -> None:
        """Stop the server: `fast` is a clean shutdown (SIGTERM, as `mariadb-admin shutdown`),
        `immediate` is SIGKILL (no flush, crash recovery at the next start). Waits for the exit."""
        if not self.running:
            return
        assert self.proc is not None
        if mode == "fast":
            self.proc.send_signal(signal.SIGTERM)
        elif mode == "immediate":
            self.proc.kill()
        else:
            raise ValueError(f"unknown stop mode {mode!r} (fast, immediate)")
        self.proc.wait(timeout=timeout)

    def kill(self) -> int:
        """SIGKILL the server and reap it (its connections die with it); returns its pid."""
        pid = self.pid
        self.stop("immediate")
        return pid

    def stall(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and unanswered, the kernel still
        queues new ones until its accept queue is full."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a stalled server go on."""
        os.kill(self.pid, signal.SIGCONT)

    def restart(self, mode: str = "fast") -> None:
        """Stop the server and start it again on the same port."""
        self.stop(mode)
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's error log."""
        text = self.error_log.read_text(errors="replace") if self.error_log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Kill the server whatever its state (stopped too) and remove its files."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.root, ignore_errors=True)
