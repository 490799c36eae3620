"""Idle CPU: what a worker, a scheduler and `treadle standalone` cost with nothing to do.

PostgreSQL: one `treadle worker --concurrency 4` and one `treadle scheduler` on a fresh
database; SQLite: one `treadle standalone --concurrency 4` on a fresh file. Both sets run side
by side. Once every process is up (the worker registered, the scheduler leading) and has had
`--settle` seconds, the CPU each process used (with its task processes) over `--seconds` is read
from /proc. Also the CPU of the PostgreSQL sessions of the database. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from _common import (
    Processes,
    check_alive,
    cli,
    code_state,
    cpu_seconds,
    emit,
    log_mentions,
    machine,
    pg_backend_pids,
    pg_database,
    print_log_tails,
    treadle_env,
    wait_for,
)

#: Share of one core an idle process may use (percent).
TARGET_PCT = 1.0

DAG = textwrap.dedent(
    """\
    from __future__ import annotations

    from treadle import dag, task


    @task
    def noop() -> None:
        return None


    @dag(dag_id="bench_idle")
    def bench_idle() -> None:
        noop()
    """
)


def _own_cpu(pid: int) -> float:
    """CPU seconds of one process alone (not its children)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between start-up and window")
    parser.add_argument("--concurrency", type=int, default=4, help="slots of each worker")
    parser.add_argument("--timeout", type=float, default=90, help="seconds to wait for start-up")
    args = parser.parse_args()

    code = code_state()
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_idle") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "idle.py").write_text(DAG)
        pg_env = treadle_env(database_url=url, dags_folder=folder, home=root / "pg-home")
        sq_env = treadle_env(
            database_url=f"sqlite:///{root / 'treadle.db'}", dags_folder=folder, home=root / "sq-home"
        )
        logs = {name: root / f"{name}.log" for name in ("worker", "scheduler", "standalone")}
        try:
            cli(["db", "upgrade"], pg_env)
            started = {
                "pg_worker": procs.start(
                    ["worker", "--concurrency", str(args.concurrency)], pg_env, logs["worker"]
                ),
                "pg_scheduler": procs.start(["scheduler"], pg_env, logs["scheduler"]),
                "sqlite_standalone": procs.start(
                    ["standalone", "--concurrency", str(args.concurrency)], sq_env, logs["standalone"]
                ),
            }
            log_list = [logs["worker"], logs["scheduler"], logs["standalone"]]

            def up() -> bool:
                check_alive(procs, log_list)
                return (
                    log_mentions(logs["worker"], '"worker.started"')
                    and log_mentions(logs["scheduler"], '"scheduler.leader_acquired"')
                    and log_mentions(logs["standalone"], '"worker.started"')
                    and log_mentions(logs["standalone"], '"scheduler.leader_acquired"')
                )

            wait_for("every process to start", up, timeout=args.timeout)
            time.sleep(args.settle)
            pids = {name: p.pid for name, p in started.items()}
            pg_sessions = pg_backend_pids(url)
            before = {name: (cpu_seconds([pid]), _own_cpu(pid)) for name, pid in pids.items()}
            before_pg = {pid: cpu_seconds([pid]) for pid in pg_sessions}
            began = time.monotonic()
            time.sleep(args.seconds)
            elapsed = time.monotonic() - began
            after = {name: (cpu_seconds([pid]), _own_cpu(pid)) for name, pid in pids.items()}
            after_pg = {pid: cpu_seconds([pid]) for pid in pg_sessions}
            check_alive(procs, log_list)
        except BaseException:
            print_log_tails(list(logs.values()))
            raise
        finally:
            procs.stop_all()
    per_process: dict[str, Any] = {}
    for name in pids:
        total = after[name][0] - before[name][0]
        own = after[name][1] - before[name][1]
        per_process[name] = {
            "cpu_pct_of_core": round(100 * total / elapsed, 3),
            "cpu_pct_of_core_without_children": round(100 * own / elapsed, 3),
            "cpu_ms": round(total * 1000, 1),
        }
    pg_cpu = sum(max(after_pg.get(p, 0.0) - before_pg[p], 0.0) for p in before_pg)
    worst = max(p["cpu_pct_of_core"] for p in per_process.values())
    emit(
        {
            "benchmark": "idle",
            "settings": {"seconds": args.seconds, "settle": args.settle, "concurrency": args.concurrency},
            "machine": machine(),
            "code": code,
            "window_s": round(elapsed, 2),
            "processes": per_process,
            "postgres_sessions_cpu_pct_of_core": round(100 * pg_cpu / elapsed, 3),
            "postgres_sessions": len(before_pg),
            "target": {"cpu_pct_of_core_per_process_below": TARGET_PCT},
            "meets_target": worst < TARGET_PCT,
        }
    )


if __name__ == "__main__":
    main()
