"""Throughput of independent no-op tasks on PostgreSQL with several worker processes.

One run of a DAG with `--tasks` independent tasks; `--workers` worker processes (each with
`--concurrency` slots) and one scheduler. Reports tasks/s from the first attempt's start to the
last attempt's end (database clock), from run creation to run end (database clock), and from
the trigger command to observed run success (wall clock). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    CpuMeter,
    Processes,
    check_alive,
    cli,
    emit,
    log_mentions,
    machine,
    pg_database,
    print_log_tails,
    summary_ms,
    treadle_env,
    wait_for,
)

from treadle.bench.workloads import independent_dag

DAG_ID = "bench_throughput"


def dag_source(tasks: int) -> str:
    """A DAG of `tasks` independent no-op tasks."""
    return independent_dag(DAG_ID, tasks)


def run_state(url: str, run_id: str) -> str:
    """The run's state as the database holds it."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state FROM dag_runs WHERE run_id = %s", (run_id,)).fetchone()
    return str(row[0]) if row else "missing"


def measure(url: str, run_id: str, tasks: int) -> dict[str, Any]:
    """Rates from database timestamps, plus how the work spread over the workers."""
    with psycopg.connect(url) as conn:
        span = conn.execute(
            "SELECT min(started_at), max(ended_at), count(*), count(DISTINCT worker_id) "
            "FROM task_attempts WHERE run_id = %s",
            (run_id,),
        ).fetchone()
        run = conn.execute(
            "SELECT created_at, ended_at, state FROM dag_runs WHERE run_id = %s", (run_id,)
        ).fetchone()
        per_worker = conn.execute(
            "SELECT worker_id, count(*) FROM task_attempts WHERE run_id = %s GROUP BY worker_id",
            (run_id,),
        ).fetchall()
        durations = conn.execute(
            "SELECT duration_s FROM task_attempts WHERE run_id = %s", (run_id,)
        ).fetchall()
        states = conn.execute(
            "SELECT state, count(*) FROM task_instances WHERE run_id = %s GROUP BY state", (run_id,)
        ).fetchall()
    assert span is not None and run is not None
    attempts_s = (span[1] - span[0]).total_seconds()
    run_s = (run[1] - run[0]).total_seconds() if run[1] else None
    return {
        "run_state": run[2],
        "task_states": dict(states),
        "attempts_recorded": span[2],
        "workers_used": span[3],
        "attempts_per_worker": sorted(n for _, n in per_worker),
        "attempts_span_s": round(attempts_s, 3),
        "claim_to_completion": summary_ms([float(d[0]) for d in durations]),
        "tasks_per_s_attempts": round(tasks / attempts_s, 1) if attempts_s > 0 else None,
        "run_span_db_s": round(run_s, 3) if run_s else None,
        "tasks_per_s_run_db": round(tasks / run_s, 1) if run_s else None,
    }


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000, help="independent tasks in the run")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=16, help="slots per worker")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the run")
    args = parser.parse_args()

    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_tp") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "throughput.py").write_text(dag_source(args.tasks))
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / f"worker{i}.log" for i in range(args.workers)] + [root / "scheduler.log"]
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env)
            for i in range(args.workers):
                procs.start(["worker", "--concurrency", str(args.concurrency)], env, logs[i])
            procs.start(["scheduler"], env, logs[-1])
            for log in logs[:-1]:
                wait_for(
                    "the workers to start", lambda log=log: log_mentions(log, '"worker.started"'), timeout=60
                )
            meter = CpuMeter(url, [p.pid for p in procs.procs])
            wall_start = time.monotonic()
            run_id = json.loads(cli(["dags", "trigger", DAG_ID, "--json"], env).stdout)["run_id"]

            def finished() -> bool:
                check_alive(procs, logs)
                return run_state(url, run_id) in ("success", "failed")

            wait_for("the run to finish", finished, timeout=args.timeout, every=0.05)
            wall_s = time.monotonic() - wall_start
            figures = measure(url, run_id, args.tasks) | meter.figures(args.tasks)
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()
    rate = figures["tasks_per_s_attempts"] or 0.0
    emit(
        {
            "benchmark": "throughput",
            "backend": "postgresql",
            "settings": {
                "tasks": args.tasks,
                "workers": args.workers,
                "concurrency_per_worker": args.concurrency,
            },
            "machine": machine(),
            **figures,
            "trigger_to_success_wall_s": round(wall_s, 3),
            "tasks_per_s_wall": round(args.tasks / wall_s, 1),
            "target": {"tasks_per_s_at_least": 500, "stretch": 1000},
            "meets_target": rate >= 500,
        }
    )


if __name__ == "__main__":
    main()
