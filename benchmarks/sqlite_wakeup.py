"""SQLite: how soon `treadle standalone` starts a run triggered by another process.

`treadle standalone --concurrency 2` on a fresh SQLite file. `--triggers` times (spaced by a
random pause, so triggers fall anywhere in a poll interval): `treadle dags trigger` of a
one-task DAG as a separate process, then the time until the run's task starts. Then
`--chain-runs` runs of a chain of `--chain` no-op tasks, each triggered the same way.
Task times are the database clock; SQLite's clock is this host's clock, so the wall time at
which the trigger process returned is comparable (the trigger commits before its process
exits, so a start can come before the return: those figures can be negative). Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import (
    Processes,
    check_alive,
    code_state,
    emit,
    log_mentions,
    machine,
    print_log_tails,
    summary_ms,
    treadle_env,
    wait_for,
)

from treadle.bench.workloads import chain_dag, independent_dag

ONE = "bench_wake_one"
CHAIN = "bench_wake_chain"
#: Median from the run's creation to its first task's start, seconds.
TARGET_START_S = 0.05
#: Median span of the chain, first task start to last task end, seconds.
TARGET_CHAIN_S = 0.5


def dag_sources(chain: int) -> dict[str, str]:
    """DAG files: a one-task DAG, and a chain of `chain` tasks each taking the previous one's output."""
    return {"one.py": independent_dag(ONE, 1), "chain.py": chain_dag(CHAIN, chain)}


def db_read(path: Path, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """A read through a fresh connection (WAL: readers never block the writer)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def trigger(env: dict[str, str], dag_id: str) -> tuple[str, datetime]:
    """Trigger `dag_id` from a separate process; returns the run id and the wall time it returned."""
    done = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "dags", "trigger", dag_id, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)["run_id"], datetime.now(UTC)


def run_times(path: Path, run_id: str) -> dict[str, Any] | None:
    """The run's creation, first start, last end and state once it has ended, else None."""
    run = db_read(path, "SELECT created_at, ended_at, state FROM dag_runs WHERE run_id = ?", (run_id,))
    if not run or run[0][2] not in ("success", "failed"):
        return None
    span = db_read(
        path, "SELECT min(started_at), max(ended_at) FROM task_attempts WHERE run_id = ?", (run_id,)
    )[0]
    return {
        "created": _ts(run[0][0]),
        "run_ended": _ts(run[0][1]),
        "state": run[0][2],
        "first_start": _ts(span[0]),
        "last_end": _ts(span[1]),
    }


def first_start(path: Path, run_id: str) -> datetime | None:
    """The first `started_at` of the run's attempts, once there is one."""
    row = db_read(path, "SELECT min(started_at) FROM task_attempts WHERE run_id = ?", (run_id,))
    return _ts(row[0][0]) if row and row[0][0] else None


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--triggers", type=int, default=10, help="one-task runs triggered")
    parser.add_argument("--chain", type=int, default=100, help="tasks in the chain")
    parser.add_argument("--chain-runs", type=int, default=3, help="chain runs triggered")
    parser.add_argument("--concurrency", type=int, default=2, help="slots of the standalone worker")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for each run")
    args = parser.parse_args()

    code = code_state()
    rng = random.Random(7)
    procs = Processes()
    starts: list[float] = []
    returns: list[float] = []
    chains: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        for name, source in dag_sources(args.chain).items():
            (folder / name).write_text(source)
        db_path = root / "treadle.db"
        env = treadle_env(database_url=f"sqlite:///{db_path}", dags_folder=folder, home=root / "home")
        log = root / "standalone.log"
        try:
            procs.start(["standalone", "--concurrency", str(args.concurrency)], env, log)
            wait_for("standalone to start", lambda: log_mentions(log, '"worker.started"'), timeout=60)
            wait_for("leadership", lambda: log_mentions(log, '"scheduler.leader_acquired"'), timeout=60)

            def ended(run_id: str) -> dict[str, Any] | None:
                found: dict[str, Any] | None = None

                def check() -> bool:
                    nonlocal found
                    check_alive(procs, [log])
                    found = run_times(db_path, run_id)
                    return found is not None

                wait_for(f"run {run_id} to end", check, timeout=args.timeout, every=0.01)
                return found

            for _ in range(args.triggers):
                time.sleep(rng.uniform(0.3, 1.3))
                run_id, returned = trigger(env, ONE)
                times = ended(run_id)
                assert times is not None
                starts.append((times["first_start"] - times["created"]).total_seconds())
                returns.append((times["first_start"] - returned).total_seconds())
            for _ in range(args.chain_runs):
                time.sleep(rng.uniform(0.3, 1.3))
                run_id, returned = trigger(env, CHAIN)
                times = ended(run_id)
                assert times is not None
                chains.append(
                    {
                        "created_to_first_start_s": (times["first_start"] - times["created"]).total_seconds(),
                        "span_s": (times["last_end"] - times["first_start"]).total_seconds(),
                        "created_to_run_ended_s": (times["run_ended"] - times["created"]).total_seconds(),
                        "trigger_return_to_run_ended_s": (times["run_ended"] - returned).total_seconds(),
                        "state": times["state"],
                    }
                )
        except BaseException:
            print_log_tails([log])
            raise
        finally:
            procs.stop_all()
    median_start = statistics.median(starts)
    median_chain = statistics.median(c["span_s"] for c in chains)
    emit(
        {
            "benchmark": "sqlite_wakeup",
            "backend": "sqlite",
            "settings": {
                "triggers": args.triggers,
                "chain": args.chain,
                "chain_runs": args.chain_runs,
                "concurrency": args.concurrency,
            },
            "machine": machine(),
            "code": code,
            "created_to_first_start": summary_ms(starts),
            "trigger_return_to_first_start": summary_ms(returns),
            "chain": {
                "span_median_s": round(median_chain, 3),
                "created_to_run_ended_median_s": round(
                    statistics.median(c["created_to_run_ended_s"] for c in chains), 3
                ),
                "trigger_return_to_run_ended_median_s": round(
                    statistics.median(c["trigger_return_to_run_ended_s"] for c in chains), 3
                ),
                "runs": [
                    {k: round(v, 3) if isinstance(v, float) else v for k, v in c.items()} for c in chains
                ],
            },
            "target": {
                "created_to_first_start_median_s": TARGET_START_S,
                "chain_span_median_s": TARGET_CHAIN_S,
            },
            "meets_target": median_start <= TARGET_START_S and median_chain <= TARGET_CHAIN_S,
        }
    )


if __name__ == "__main__":
    main()
