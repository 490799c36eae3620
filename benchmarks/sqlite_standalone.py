"""`treadle standalone` on a SQLite file under concurrent CLI reads.

One run of `--tasks` independent no-op tasks while a reader loop keeps running
`treadle runs list --json` and `treadle runs show RUN_ID --json` as separate processes.
Reports tasks/s (database clock) and every "database is locked" seen in the standalone log
or in the readers' output; that count must be 0. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import (
    Processes,
    check_alive,
    count_in_logs,
    emit,
    log_mentions,
    machine,
    print_log_tails,
    treadle_env,
    wait_for,
)

from treadle.bench.workloads import independent_dag

DAG_ID = "bench_sqlite"
LOCKED = "database is locked"


def dag_source(tasks: int) -> str:
    """A DAG of `tasks` independent no-op tasks."""
    return independent_dag(DAG_ID, tasks)


class Readers(threading.Thread):
    """Runs CLI reads back to back until stopped, keeping what they print on stderr."""

    def __init__(self, env: dict[str, str], run_id: str) -> None:
        super().__init__(name="cli-readers", daemon=True)
        self.env, self.run_id = env, run_id
        self.stop = threading.Event()
        self.reads = 0
        self.failures = 0
        self.stderr: list[str] = []

    def run(self) -> None:
        commands = [["runs", "list", "--json"], ["runs", "show", self.run_id, "--json"]]
        while not self.stop.is_set():
            args = commands[self.reads % 2]
            done = subprocess.run(
                [sys.executable, "-m", "treadle.cli", *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            self.reads += 1
            if done.returncode != 0:
                self.failures += 1
            if done.stderr:
                self.stderr.append(done.stderr)


def db_read(path: Path, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """A read through a fresh connection (WAL: readers never block the writer)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


def measure(path: Path, run_id: str, tasks: int) -> dict[str, Any]:
    """Rates from database timestamps."""
    span = db_read(
        path,
        "SELECT min(started_at), max(ended_at), count(*) FROM task_attempts WHERE run_id = ?",
        (run_id,),
    )[0]
    run = db_read(path, "SELECT created_at, ended_at, state FROM dag_runs WHERE run_id = ?", (run_id,))[0]
    attempts_s = (_ts(span[1]) - _ts(span[0])).total_seconds()
    run_s = (_ts(run[1]) - _ts(run[0])).total_seconds() if run[1] else None
    return {
        "run_state": run[2],
        "attempts_recorded": span[2],
        "attempts_span_s": round(attempts_s, 3),
        "tasks_per_s_attempts": round(tasks / attempts_s, 1) if attempts_s > 0 else None,
        "run_span_db_s": round(run_s, 3) if run_s else None,
        "tasks_per_s_run_db": round(tasks / run_s, 1) if run_s else None,
    }


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000, help="independent tasks in the run")
    parser.add_argument("--concurrency", type=int, default=4, help="slots of the standalone worker")
    parser.add_argument("--readers", type=int, default=2, help="CLI read loops running at once")
    parser.add_argument("--timeout", type=float, default=150, help="seconds to wait for the run")
    args = parser.parse_args()

    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "many.py").write_text(dag_source(args.tasks))
        db_path = root / "treadle.db"
        env = treadle_env(database_url=f"sqlite:///{db_path}", dags_folder=folder, home=root / "home")
        log = root / "standalone.log"
        readers: list[Readers] = []
        try:
            procs.start(["standalone", "--concurrency", str(args.concurrency)], env, log)
            wait_for("standalone to start", lambda: log_mentions(log, '"worker.started"'), timeout=60)
            wall_start = time.monotonic()
            trigger = subprocess.run(
                [sys.executable, "-m", "treadle.cli", "dags", "trigger", DAG_ID, "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            run_id = json.loads(trigger.stdout)["run_id"]
            readers = [Readers(env, run_id) for _ in range(args.readers)]
            for reader in readers:
                reader.start()

            def finished() -> bool:
                check_alive(procs, [log])
                rows = db_read(db_path, "SELECT state FROM dag_runs WHERE run_id = ?", (run_id,))
                return bool(rows) and rows[0][0] in ("success", "failed")

            wait_for("the run to finish", finished, timeout=args.timeout, every=0.1)
            wall_s = time.monotonic() - wall_start
            for reader in readers:
                reader.stop.set()
            for reader in readers:
                reader.join(timeout=60)
            figures = measure(db_path, run_id, args.tasks)
        except BaseException:
            print_log_tails([log])
            raise
        finally:
            for reader in readers:
                reader.stop.set()
            procs.stop_all()
        reader_errors = "\n".join(e for r in readers for e in r.stderr)
        locked_log = count_in_logs([log], LOCKED)
        retries_log = count_in_logs([log], '"store.retry"')
        errors_log = count_in_logs([log], '"level": "error"')
    locked_cli = reader_errors.lower().count(LOCKED)
    rate = figures["tasks_per_s_attempts"] or 0.0
    emit(
        {
            "benchmark": "sqlite_standalone",
            "backend": "sqlite",
            "settings": {"tasks": args.tasks, "concurrency": args.concurrency, "cli_readers": args.readers},
            "machine": machine(),
            **figures,
            "trigger_to_success_wall_s": round(wall_s, 3),
            "cli_reads": sum(r.reads for r in readers),
            "cli_read_failures": sum(r.failures for r in readers),
            "database_locked_errors": locked_log + locked_cli,
            "database_locked_in_standalone_log": locked_log,
            "database_locked_in_cli_stderr": locked_cli,
            "transient_retries_in_standalone_log": retries_log,
            "error_lines_in_standalone_log": errors_log,
            "target": {"tasks_per_s_at_least": 200, "database_locked_errors": 0},
            "meets_target": rate >= 200 and locked_log + locked_cli == 0,
        }
    )


if __name__ == "__main__":
    main()
