"""A PostgreSQL server of one test's own, to restart, kill and stall without touching the shared one.

`initdb` in a fresh folder, started on a free port and a private socket directory, run as the
`postgres` user when the tests run as root (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrivatePostgres:
    """One throwaway PostgreSQL cluster; `close()` stops it and removes its files."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None:
            raise FileNotFoundError("initdb not found (install the PostgreSQL server package)")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="treadle-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    @property
    def url(self) -> str:
        """The URL of its `postgres` database over TCP."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`immediate`: no checkpoint, crash recovery at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def postmaster_pid(self) -> int:
        """The server's main process."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def signal(self, sig: int) -> None:
        """Send a signal to the server's main process (SIGSTOP stalls new connections)."""
        os.kill(self.postmaster_pid(), sig)

    def processes(self) -> list[int]:
        """The server's main process and every process it started (backends, background)."""
        main = self.postmaster_pid()
        found = [main]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == main:  # the parent pid
                found.append(int(stat.parent.name))
        return found

    def stall(self) -> list[int]:
        """Freeze the whole server (SIGSTOP to every one of its processes); returns them."""
        frozen = self.processes()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        return frozen

    def resume(self, frozen: list[int]) -> None:
        """Let stalled processes go on."""
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def kill(self) -> list[int]:
        """SIGKILL the server's main process (its backends exit on their own); returns them all."""
        doomed = self.processes()
        os.kill(doomed[0], signal.SIGKILL)
        return doomed

    def close(self) -> None:
        """Stop the server whatever its state and remove its files."""
        try:
            self.signal(signal.SIGCONT)
        except (OSError, ValueError):
            pass
        try:
            self.stop()
        except (subprocess.SubprocessError, OSError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)
