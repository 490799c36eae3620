"""Plumbing for benchmarks: databases, real treadle processes, CPU meters, DB-clock figures.

Used by `treadle bench` and by the scripts in the repository's benchmarks/ folder.

Every figure is computed from timestamps the database wrote (its clock is the only one
treadle trusts), except the explicitly labelled wall-clock times measured here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from treadle.bench.figures import dist_ms, percentile, summary_ms

__all__ = [
    "PG_ADMIN_URL",
    "CpuMeter",
    "Processes",
    "check_alive",
    "cli",
    "count_in_logs",
    "cpu_seconds",
    "dist_ms",
    "emit",
    "log_mentions",
    "machine",
    "migrate",
    "percentile",
    "pg_backend_pids",
    "pg_database",
    "pg_url",
    "print_log_tails",
    "server_settings",
    "stop_groups",
    "summary_ms",
    "treadle_env",
    "wait_for",
]

PG_ADMIN_URL = os.environ.get("TREADLE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


def pg_url(name: str, admin_url: str | None = None) -> str:
    """URL of database `name` on the benchmark PostgreSQL server (that of `admin_url`)."""
    base, _, _ = (admin_url or PG_ADMIN_URL).rpartition("/")
    return f"{base}/{name}"


@contextmanager
def pg_database(prefix: str, admin_url: str | None = None) -> Iterator[str]:
    """Create a fresh PostgreSQL database for one benchmark and drop it afterwards.

    `admin_url` (default TREADLE_BENCH_PG) names a database of the server whose user may create
    databases; the new one is named `{prefix}_{random}`.
    """
    import psycopg

    admin = (admin_url or PG_ADMIN_URL).replace("postgresql+psycopg://", "postgresql://")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_url(name, admin)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def treadle_env(*, database_url: str, dags_folder: Path, home: Path, **extra: str) -> dict[str, str]:
    """Environment for one treadle process of a benchmark."""
    env = dict(os.environ)
    env.update(
        {
            "TREADLE_DATABASE_URL": database_url,
            "TREADLE_DAGS_FOLDER": str(dags_folder),
            "TREADLE_HOME": str(home),
            "TREADLE_SCHEDULER_TICK_SECONDS": "0.5",
            **extra,
        }
    )
    return env


def cli(args: list[str], env: dict[str, str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one `treadle` command to completion; raise with its stderr if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "treadle.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"treadle {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def migrate(url: str) -> None:
    """Bring a fresh database to the current schema, in this process (a `treadle db upgrade`
    without the cost of starting one more interpreter)."""
    from treadle.store.database import Database
    from treadle.store.migrate import upgrade

    db = Database(url, application_name="treadle-bench", pool_size=1)
    try:
        upgrade(db)
    finally:
        db.dispose()


class Processes:
    """Long-running treadle processes, each in its own session so a kill takes its children."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        """Start `treadle ARGS...` with stdout and stderr going to `log_path`."""
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "treadle.cli", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        """SIGTERM every process group, then SIGKILL whatever is left."""
        stop_groups(self.procs, grace_s=10)


def stop_groups(procs: list[subprocess.Popen[bytes]], *, grace_s: float) -> None:
    """SIGTERM each process group, wait up to `grace_s` in all, then SIGKILL what is left."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for(what: str, check: Callable[[], bool], *, timeout: float, every: float = 0.1) -> float:
    """Poll `check` until it is true; returns the wait in seconds, raises TimeoutError."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - start


def log_mentions(path: Path, text: str, *, count: int = 1) -> bool:
    """True once `text` appears at least `count` times in a log file."""
    try:
        return path.read_text(errors="replace").count(text) >= count
    except FileNotFoundError:
        return False


def check_alive(procs: Processes, logs: list[Path]) -> None:
    """Raise if a treadle process ended early, quoting the end of its log."""
    for proc, log in zip(procs.procs, logs, strict=False):
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"a treadle process exited with {proc.returncode}:\n{tail}")


#: PostgreSQL settings that move the figures, reported with them.
SERVER_SETTINGS = ("server_version", "autovacuum", "fsync", "synchronous_commit", "shared_buffers")


def server_settings(url: str) -> dict[str, str]:
    """The PostgreSQL server's version and the settings that move the figures (autovacuum off,
    for one, leaves the index entries of claimed rows for every later claim to step over)."""
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    found = {}
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            for name in SERVER_SETTINGS:
                row = conn.execute(f"SHOW {name}").fetchone()
                found[name] = str(row[0]) if row else "?"
    except psycopg.Error as exc:  # the workloads report the unreachable server themselves
        return {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    return found


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {"cores": os.cpu_count(), "python": sys.version.split()[0], "platform": sys.platform}


def emit(result: dict[str, Any]) -> None:
    """Print the one JSON object a benchmark reports."""
    print(json.dumps(result, indent=2, default=str))


def count_in_logs(paths: list[Path], text: str) -> int:
    """How many times `text` occurs across some log files (case-insensitive)."""
    total = 0
    for path in paths:
        if path.exists():
            total += path.read_text(errors="replace").lower().count(text.lower())
    return total


def print_log_tails(logs: list[Path]) -> None:
    """Copy the end of each treadle log to stderr (called on failure, before the temp folder goes)."""
    for path in logs:
        if path.exists():
            print(f"--- {path.name} (end) ---", file=sys.stderr)
            print(path.read_text(errors="replace")[-4000:], file=sys.stderr)


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a live process, from /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks


def cpu_seconds(roots: list[int]) -> float:
    """CPU seconds used so far by some processes and all their live descendants (Linux only)."""
    if not Path("/proc/self/stat").exists():
        return float("nan")
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _proc_stat(int(entry.name))) is not None:
            stats[int(entry.name)] = found
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


def pg_backend_pids(url: str) -> list[int]:
    """Server process ids of every other session on the benchmark's database."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(r[0]) for r in rows]


class CpuMeter:
    """CPU used by some treadle processes (with their children) and the database's sessions."""

    def __init__(self, url: str | None, roots: list[int]) -> None:
        self.url, self.roots = url, roots
        self.start_procs = cpu_seconds(roots)
        self.start_pg = self._pg()

    def _pg(self) -> dict[int, float]:
        if self.url is None:
            return {}
        return {pid: cpu_seconds([pid]) for pid in pg_backend_pids(self.url)}

    def figures(self, tasks: int) -> dict[str, float]:
        """CPU milliseconds per task so far, split into treadle processes and database sessions."""
        procs = cpu_seconds(self.roots) - self.start_procs
        result = {"treadle_cpu_ms_per_task": round(procs * 1000 / tasks, 3)}
        if self.url is not None:
            pg = sum(max(c - self.start_pg.get(pid, 0.0), 0.0) for pid, c in self._pg().items())
            result["postgres_cpu_ms_per_task"] = round(pg * 1000 / tasks, 3)
        return result
