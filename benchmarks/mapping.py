"""A 1,000-element mapped task on PostgreSQL with two workers and a scheduler.

The DAG is `discover` (returns the list) -> `process.expand(item=...)` (a no-op per element) ->
`reduce` (receives the 1,000 results in order). From `discover`'s success (its `ended_at`, the
database time of the completion that expands the mapped task), the script measures:

* `to_expansion_written_ms`: to the `queued_at` of the instances, written by the expansion in the
  same transaction (the cost of creating them);
* `to_all_queued_visible_ms`: to the first moment an outside connection polling every few ms
  (database clock) sees all instances, i.e. once that transaction committed;
* `to_first_instance_started_ms`: to the earliest `started_at` of an instance;
* `to_run_success_s`: to the run's `ended_at`, every instance run and reduced.

Prints one JSON object, with the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
import time
from datetime import datetime
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
    treadle_env,
    wait_for,
)

from treadle.engine.runs import trigger_run
from treadle.store.database import Database

DAG_ID = "bench_mapping"


def dag_source(size: int) -> str:
    """The mapped DAG over `size` elements."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        from treadle import dag, task


        @task
        def discover() -> list[int]:
            return list(range({size}))


        @task
        def process(item: int) -> int:
            return item


        @task
        def reduce(values: list[int]) -> int:
            return len(values)


        @dag(dag_id="{DAG_ID}")
        def {DAG_ID}() -> None:
            reduce(process.expand(item=discover()))
        """
    )


def watch_expansion(url: str, run_id: str, size: int, timeout: float) -> tuple[datetime, datetime]:
    """Poll until the mapped task's instances exist; returns (discover's end, when all were seen)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT clock_timestamp(), "
                "(SELECT count(*) FROM task_instances WHERE run_id = %s AND task_id = 'process' "
                " AND map_index >= 0), "
                "(SELECT ended_at FROM task_instances WHERE run_id = %s AND task_id = 'discover' "
                " AND state = 'success')",
                (run_id, run_id),
            ).fetchone()
            assert row is not None
            seen_at, count, discovered = row
            if count == size and discovered is not None:
                return discovered, seen_at
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {size} instances did not appear within {timeout} s")
            time.sleep(0.002)


def figures(url: str, run_id: str, discovered: datetime, seen: datetime) -> dict[str, Any]:
    """The timings of one run, from the database's times."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT max(queued_at), min(started_at), count(*) FROM task_instances "
            "WHERE run_id = %s AND task_id = 'process' AND map_index >= 0 AND attempt = 1",
            (run_id,),
        ).fetchone()
        run = conn.execute("SELECT state, ended_at FROM dag_runs WHERE run_id = %s", (run_id,)).fetchone()
        reduced = conn.execute(
            "SELECT r.value FROM task_results r JOIN task_instances t ON t.id = r.task_instance_id "
            "WHERE t.run_id = %s AND t.task_id = 'reduce'",
            (run_id,),
        ).fetchone()
    assert row is not None and run is not None
    queued, first_start, ran = row
    return {
        "run_state": run[0],
        "instances_run_once": ran,
        "reduced_length": reduced[0] if reduced else None,
        "to_expansion_written_ms": round((queued - discovered).total_seconds() * 1000, 1),
        "to_all_queued_visible_ms": round((seen - discovered).total_seconds() * 1000, 1),
        "to_first_instance_started_ms": round((first_start - discovered).total_seconds() * 1000, 1),
        "to_run_success_s": round((run[1] - discovered).total_seconds(), 3),
    }


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=1000, help="elements to map over")
    parser.add_argument("--concurrency", type=int, default=4, help="slots per worker (two workers)")
    parser.add_argument("--runs", type=int, default=3, help="measured runs, one after another")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for one run")
    args = parser.parse_args()

    load_before = os.getloadavg()
    procs = Processes()
    results = []
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_map") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "mapping.py").write_text(dag_source(args.size))
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / "worker0.log", root / "worker1.log", root / "scheduler.log"]
        db = Database(url, application_name="treadle-bench")
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env)
            for log in logs[:2]:
                procs.start(["worker", "--concurrency", str(args.concurrency)], env, log)
            procs.start(["scheduler"], env, logs[2])
            for log in logs[:2]:
                wait_for("the workers", lambda log=log: log_mentions(log, '"worker.started"'), timeout=60)
            for _ in range(args.runs):
                run_id = trigger_run(db, DAG_ID, triggered_by="bench-mapping").run_id
                discovered, seen = watch_expansion(url, run_id, args.size, args.timeout)

                def finished(run_id: str = run_id) -> bool:
                    check_alive(procs, logs)
                    return _finished(url, run_id)

                wait_for("the run to finish", finished, timeout=args.timeout)
                results.append(figures(url, run_id, discovered, seen))
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()
            db.dispose()
    load_after = os.getloadavg()
    worst_queued = max(r["to_all_queued_visible_ms"] for r in results)
    emit(
        {
            "benchmark": "mapping",
            "backend": "postgresql",
            "settings": {"size": args.size, "workers": 2, "concurrency_per_worker": args.concurrency},
            "machine": machine(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
            "runs": results,
            "target": {"to_all_queued_visible_ms_below": 1000},
            "meets_target": worst_queued < 1000 and all(r["run_state"] == "success" for r in results),
        }
    )


def _finished(url: str, run_id: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state FROM dag_runs WHERE run_id = %s", (run_id,)).fetchone()
    return row is not None and row[0] in ("success", "failed")


if __name__ == "__main__":
    main()
