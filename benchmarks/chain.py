"""Per-hop overhead of a linear chain on PostgreSQL.

A hop is the gap between one task's `ended_at` and the next task's `started_at`, both written
by the database clock: completion transaction, NOTIFY, wake-up, claim, dispatch to a child.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
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

from treadle.bench.workloads import chain_dag

DAG_ID = "bench_chain"


def dag_source(tasks: int) -> str:
    """A DAG whose tasks each take the previous task's output (a chain of `tasks`)."""
    return chain_dag(DAG_ID, tasks)


def run_state(url: str, run_id: str) -> str:
    """The run's state as the database holds it."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state FROM dag_runs WHERE run_id = %s", (run_id,)).fetchone()
    return str(row[0]) if row else "missing"


def measure(url: str, run_id: str) -> dict[str, Any]:
    """Hop gaps and run duration, all from database timestamps."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT started_at, ended_at FROM task_instances WHERE run_id = %s ORDER BY started_at",
            (run_id,),
        ).fetchall()
        run = conn.execute(
            "SELECT created_at, ended_at, state FROM dag_runs WHERE run_id = %s", (run_id,)
        ).fetchone()
        attempts = conn.execute("SELECT count(*) FROM task_attempts WHERE run_id = %s", (run_id,)).fetchone()
    assert run is not None and attempts is not None
    hops = [(b[0] - a[1]).total_seconds() for a, b in itertools.pairwise(rows)]
    return {
        "run_state": run[2],
        "attempts_recorded": attempts[0],
        "hop_overhead": summary_ms(hops),
        "hops": len(hops),
        "run_duration_s": round((run[1] - run[0]).total_seconds(), 3) if run[1] else None,
        "first_task_start_delay_ms": round((rows[0][0] - run[0]).total_seconds() * 1000, 2),
    }


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=100, help="length of the chain")
    parser.add_argument("--concurrency", type=int, default=2, help="slots of the worker")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the run")
    args = parser.parse_args()

    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_chain") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "chain.py").write_text(dag_source(args.tasks))
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / "worker.log", root / "scheduler.log"]
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env)
            procs.start(["worker", "--concurrency", str(args.concurrency)], env, logs[0])
            procs.start(["scheduler"], env, logs[1])
            wait_for("the worker to start", lambda: log_mentions(logs[0], '"worker.started"'), timeout=60)
            wall_start = time.monotonic()
            run_id = json.loads(cli(["dags", "trigger", DAG_ID, "--json"], env).stdout)["run_id"]

            def finished() -> bool:
                check_alive(procs, logs)
                return run_state(url, run_id) in ("success", "failed")

            wait_for("the run to finish", finished, timeout=args.timeout, every=0.05)
            wall_s = time.monotonic() - wall_start
            figures = measure(url, run_id)
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()
    emit(
        {
            "benchmark": "chain",
            "backend": "postgresql",
            "settings": {"tasks": args.tasks, "concurrency": args.concurrency, "workers": 1},
            "machine": machine(),
            **figures,
            "target": {"median_hop_ms_below": 20},
            "meets_target": figures["hop_overhead"].get("median_ms", 1e9) < 20,
            "trigger_to_success_wall_s": round(wall_s, 3),
        }
    )


if __name__ == "__main__":
    main()
