"""Plumbing of the scheduler benchmarks (schedules, failover, burst): scheduled DAGs, pausing
many at once, the processes of one measurement, slot bookkeeping and the scheduler's log."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from treadle.bench.db import BenchDb
from treadle.bench.harness import Processes, check_alive, log_mentions, print_log_tails, treadle_env, wait_for
from treadle.bench.probe import start_probed_scheduler


def _quiet(_: str) -> None:
    return None


#: A progress callback that says nothing.
QUIET: Callable[[str], None] = _quiet
#: Longest wait for a process to start (a worker registers its DAG folder first); generous,
#: because a shared 2-core machine at load 8 starts a Python process in seconds, not tenths.
STARTUP_S = 120.0


def write_scheduled_dags(
    folder: Path,
    *,
    prefix: str,
    count: int,
    schedule: str,
    per_file: int = 1000,
    catchup: bool = False,
) -> list[str]:
    """Write `count` DAGs of one no-op task each, `per_file` to a file (built in a loop).

    `schedule` is the Python source of the `schedule=` argument, e.g. `timedelta(seconds=1)` or
    `"* * * * *"`. Returns the DAG ids, `{prefix}_{i:05d}`.
    """
    ids = [f"{prefix}_{i:05d}" for i in range(count)]
    for part, first in enumerate(range(0, count, per_file)):
        last = min(first + per_file, count)
        source = f"""\
from __future__ import annotations

from datetime import timedelta

from treadle import dag, task


@task
def noop() -> None:
    return None


def build(dag_id: str):
    @dag(dag_id=dag_id, schedule={schedule}, catchup={catchup!r})
    def flow() -> None:
        noop()

    return flow


for _i in range({first}, {last}):
    globals()[f"dag_{{_i}}"] = build(f"{prefix}_{{_i:05d}}")
"""
        (folder / f"{prefix}_{part:03d}.py").write_text(source)
    return ids


def set_paused_many(url: str, dag_ids: list[str], *, paused: bool) -> datetime:
    """Pause or unpause many DAGs in ONE transaction (store API, audited); returns its DB time."""
    from sqlalchemy.engine import Connection

    from treadle.store import audit
    from treadle.store import dags as dag_store
    from treadle.store.database import Database, db_now

    db = Database(url, application_name="treadle-bench")

    def work(conn: Connection) -> datetime:
        now = db_now(conn)
        for dag_id in dag_ids:
            if dag_store.set_paused(conn, dag_id, paused=paused, now=now):
                action = "dag.pause" if paused else "dag.unpause"
                audit.record(conn, at=now, actor="bench", action=action, target=dag_id)
        return now

    try:
        return db.transact(work)
    finally:
        db.dispose()


class Cluster:
    """The DAG folder, environment, processes and logs of one scheduler measurement."""

    def __init__(self, root: Path, url: str, **extra_env: str) -> None:
        self.root, self.url = root, url
        self.folder = root / "dags"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.env = treadle_env(database_url=url, dags_folder=self.folder, home=root / "home", **extra_env)
        self.procs = Processes()
        #: One log per process, in the order of `procs.procs`.
        self.logs: list[Path] = []
        self.bdb = BenchDb(url)

    @property
    def is_sqlite(self) -> bool:
        """Whether the database is a SQLite file."""
        return self.bdb.sqlite_path is not None

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start `treadle ARGS...` logging to ROOT/NAME.log."""
        log = self.root / f"{name}.log"
        self.logs.append(log)
        return self.procs.start(args, self.env, log)

    def start_scheduler(self, name: str, *, probe: Path | None = None) -> subprocess.Popen[bytes]:
        """Start `treadle scheduler`, under the loop probe when `probe` names its output file."""
        if probe is None:
            return self.start(name, ["scheduler"])
        log = self.root / f"{name}.log"
        self.logs.append(log)
        return start_probed_scheduler(self.procs, self.env, log, probe)

    def log(self, name: str) -> Path:
        """The log file of process `name`."""
        return self.root / f"{name}.log"

    def wait_log(self, name: str, text: str, what: str, *, timeout: float) -> None:
        """Wait until process `name` logged `text`, raising if a process ends meanwhile."""

        def seen() -> bool:
            self.alive()
            return log_mentions(self.log(name), text)

        wait_for(what, seen, timeout=timeout)

    def alive(self) -> None:
        """Raise if a process ended early, quoting the end of its log."""
        check_alive(self.procs, self.logs)

    def dump_logs(self) -> None:
        """Copy the end of each log to stderr (on failure)."""
        print_log_tails(self.logs)

    def stop(self) -> None:
        """Stop every process and close the pool."""
        self.procs.stop_all()
        self.bdb.close()


def holder_pid(holder: str | None) -> int | None:
    """The process id in a scheduler holder string `host:pid:rand` (None if unparseable)."""
    if not holder:
        return None
    parts = holder.rsplit(":", 2)
    try:
        return int(parts[-2])
    except (IndexError, ValueError):
        return None


def slot_audit(
    slots: list[tuple[str, datetime]], dag_ids: list[str], expected: list[datetime], *, sample: int = 10
) -> dict[str, Any]:
    """Compare each DAG's slots (dag_id, data_interval_end) with the expected ones, exactly once.

    Slots outside `expected` are ignored (the caller selects a window). Returns how many are
    missing and how many are duplicated, with a few examples of each.
    """
    wanted = set(expected)
    seen: dict[tuple[str, datetime], int] = {}
    for dag_id, end in slots:
        if end in wanted:
            seen[(dag_id, end)] = seen.get((dag_id, end), 0) + 1
    missing = [(d, t) for d in dag_ids for t in expected if (d, t) not in seen]
    duplicated = [(k, n) for k, n in seen.items() if n > 1]
    return {
        "expected_slots": len(dag_ids) * len(expected),
        "missed": len(missing),
        "duplicated": sum(n - 1 for _, n in duplicated),
        "missed_examples": [f"{d}@{t.isoformat()}" for d, t in missing[:sample]],
        "duplicated_examples": [f"{d}@{t.isoformat()} x{n}" for (d, t), n in duplicated[:sample]],
    }


def whole_second_after(t: datetime) -> datetime:
    """The first whole second at or after `t`."""
    floor = t.replace(microsecond=0)
    return floor if floor == t else floor + timedelta(seconds=1)


def seconds_from(start: datetime, end: datetime) -> list[datetime]:
    """Every whole second from `start` (inclusive) to `end` (exclusive)."""
    found = []
    t = start
    while t < end:
        found.append(t)
        t += timedelta(seconds=1)
    return found


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of one event (`"event": NAME`) in a process log, in order."""
    found: list[dict[str, Any]] = []
    if not path.exists():
        return found
    marker = f'"{event}"'
    for line in path.read_text(errors="replace").splitlines():
        if marker not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event:
            found.append(entry)
    return found


def fired_log(path: Path) -> list[tuple[datetime, int]]:
    """(host time logged, runs) of each "runs created" line of a scheduler log (after the commit)."""
    return [
        (datetime.fromisoformat(e["ts"]), int(e.get("runs", 0))) for e in log_events(path, "scheduler.fired")
    ]


def monotonic_since(began: float) -> float:
    """Seconds since a `time.monotonic()` reading, rounded to 0.1."""
    return round(time.monotonic() - began, 1)
