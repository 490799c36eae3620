"""How soon a worker claims: wall time from starting `treadle worker` to its first claim.

A fresh PostgreSQL database, a DAG folder of `--files` generated files (each a small DAG, some
importing json, decimal or csv) plus one fan-out DAG of `--concurrency` one-second tasks, whose
run is triggered before the worker starts; `--slow-file-s` adds a file that takes that long to
import. Reports the wall time from launching the worker to
its first task's start (the database's `started_at`), to every slot running a task, and to the
worker's row reading `running` (it reads `starting` until the worker can claim), and the
start-up log lines' times. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path

import psycopg
from _common import (
    Processes,
    check_alive,
    cli,
    code_state,
    emit,
    machine,
    pg_database,
    print_log_tails,
    treadle_env,
    wait_for,
)
from children import FANOUT_DAG, fanout_dag

#: Target: a worker claims within this many seconds of its start.
TARGET_START_TO_CLAIM_S = 2.0
HEAVY = ("json", "decimal", "csv")


def small_dag(i: int) -> str:
    """A small DAG; one file in two imports a moderately heavy stdlib module."""
    extra = f"import {HEAVY[i % 3]}  # noqa: F401\n" if i % 2 == 0 else ""
    return extra + textwrap.dedent(
        f"""\
        from treadle import dag, task


        @task
        def first() -> int:
            return {i}


        @task
        def second(n: int) -> int:
            return n + 1


        @dag(dag_id="ws_{i:03d}")
        def ws_{i:03d}() -> None:
            second(first())
        """
    )


def log_events(log: Path, launched: float) -> dict[str, float]:
    """Seconds from launching the worker (host clock) to the first log line of each event."""
    found: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "event" in entry and entry["event"] not in found:
            found[str(entry["event"])] = round(datetime.fromisoformat(entry["ts"]).timestamp() - launched, 3)
    return found


def progress(url: str, worker_pid: int) -> tuple[int, str | None]:
    """(fan-out tasks started, the worker's state in the workers table)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(started_at) FROM task_instances WHERE dag_id = %s", (FANOUT_DAG,)
        ).fetchone()
        state = conn.execute("SELECT state FROM workers WHERE pid = %s", (worker_pid,)).fetchone()
    assert row is not None
    return int(row[0]), None if state is None else str(state[0])


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=200, help="generated DAG files")
    parser.add_argument("--concurrency", type=int, default=16, help="slots of the worker")
    parser.add_argument(
        "--slow-file-s",
        type=float,
        default=0.0,
        help="add one DAG file that takes this long to import (sorted first in the folder)",
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for each step")
    args = parser.parse_args()

    code = code_state()
    load_before = os.getloadavg()
    procs = Processes()
    with (
        tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp,
        pg_database("bench_worker_start") as url,
    ):
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        for i in range(args.files):
            (folder / f"ws_{i:03d}.py").write_text(small_dag(i))
        (folder / "fanout.py").write_text(fanout_dag(args.concurrency))
        if args.slow_file_s > 0:
            (folder / "a_slow.py").write_text(
                f"import time\n\ntime.sleep({args.slow_file_s})\n" + small_dag(999)
            )
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / "worker.log"]
        states: dict[str, float] = {}
        marks: dict[str, float] = {}
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env, timeout=args.timeout)
            cli(["dags", "trigger", FANOUT_DAG, "--json"], env)  # its tasks wait for the worker
            began, launched = time.monotonic(), time.time()
            worker = procs.start(["worker", "--concurrency", str(args.concurrency)], env, logs[0])

            def all_started() -> bool:
                check_alive(procs, logs)
                started, state = progress(url, worker.pid)
                now = round(time.monotonic() - began, 3)
                if state is not None:
                    states.setdefault(state, now)
                if started and "first_claim" not in marks:
                    marks["first_claim"] = now
                return started >= args.concurrency

            wait_for("every slot to run a task", all_started, timeout=args.timeout, every=0.02)
            marks["all_slots_running"] = round(time.monotonic() - began, 3)
            phases = log_events(logs[0], launched)
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()
    to_claim = marks.get("first_claim", float("inf"))
    emit(
        {
            "benchmark": "worker_start",
            "backend": "postgresql",
            "settings": {
                "files": args.files,
                "concurrency": args.concurrency,
                "slow_file_s": args.slow_file_s,
            },
            "machine": machine(),
            "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "code": code,
            "start_to_first_claim_s": to_claim,
            "start_to_all_slots_running_s": marks["all_slots_running"],
            "worker_state_first_seen_s": states,
            "log_events_s": phases,
            "target": {"start_to_first_claim_s_below": TARGET_START_TO_CLAIM_S},
            "meets_target": to_claim < TARGET_START_TO_CLAIM_S,
        }
    )


if __name__ == "__main__":
    main()
