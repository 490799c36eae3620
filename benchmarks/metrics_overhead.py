"""What metrics cost: the throughput benchmark (independent no-op tasks on PostgreSQL, worker
processes and a scheduler) run alternately without and with TREADLE_METRICS_PORT set.

With metrics, every worker and the scheduler serve /metrics, and the script scrapes each of them
every --scrape-interval seconds while the run goes on (1 s: far more often than Prometheus
usually does) and checks at the end that the workers counted every task. It also times the
hooks of one attempt in-process (the hot path's share, without the noise of a shared machine).
Prints one JSON object: tasks/s and CPU per task of each mode (median of the repetitions) and
the relative cost. Target: under 5 %.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from _common import (
    CpuMeter,
    Processes,
    check_alive,
    cli,
    emit,
    machine,
    pg_database,
    print_log_tails,
    treadle_env,
    wait_for,
)
from throughput import DAG_ID, dag_source, measure, run_state


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> str:
    """The exposition of one process ("" while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def successes(text: str) -> float:
    """Successful attempts a worker counted (summed over tasks)."""
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("treadle_task_outcomes_total{") and 'outcome="success"' in line
    )


def scrape_every(interval_s: float, ports: list[int], stop: threading.Event) -> None:
    """Scrape every process every `interval_s` until `stop`."""
    while not stop.wait(interval_s):
        for port in ports:
            scrape(port)


def one_run(args: argparse.Namespace, *, metrics: bool) -> dict[str, Any]:
    """One run of the throughput workload; its figures."""
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_mo") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "throughput.py").write_text(dag_source(args.tasks))
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / f"worker{i}.log" for i in range(args.workers)] + [root / "scheduler.log"]
        ports = [free_port() for _ in logs] if metrics else []
        stop = threading.Event()
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env)
            for i, log in enumerate(logs):
                extra = {"TREADLE_METRICS_PORT": str(ports[i])} if metrics else {}
                command = (
                    ["worker", "--concurrency", str(args.concurrency)] if i < args.workers else ["scheduler"]
                )
                procs.start(command, {**env, **extra}, log)
            for log in logs[:-1]:
                wait_for(
                    "a worker to start", lambda log=log: '"worker.started"' in log.read_text(), timeout=60
                )
            scraper = threading.Thread(target=scrape_every, args=(args.scrape_interval, ports, stop))
            scraper.start()
            meter = CpuMeter(url, [p.pid for p in procs.procs])
            run_id = json.loads(cli(["dags", "trigger", DAG_ID, "--json"], env).stdout)["run_id"]

            def finished() -> bool:
                check_alive(procs, logs)
                return run_state(url, run_id) in ("success", "failed")

            wait_for("the run to finish", finished, timeout=args.timeout, every=0.05)
            figures = measure(url, run_id, args.tasks) | meter.figures(args.tasks)
            if metrics:
                counted = sum(successes(scrape(p)) for p in ports[: args.workers])
                figures["successes_counted_by_metrics"] = counted
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            stop.set()
            procs.stop_all()
    return figures


def hook_cost_us_per_task(tasks: int) -> float:
    """Microseconds the hooks of one task's attempt cost in the worker (finished, started, and
    one database call), measured in this process over `tasks` distinct tasks."""
    from treadle.observability.metrics import Metrics

    metrics = Metrics()
    began = time.perf_counter()
    for n in range(tasks):
        metrics.attempt_started(dag_id=DAG_ID, delay_s=0.01)
        metrics.attempt_finished(dag_id=DAG_ID, task_id=f"t{n}", outcome="success", duration_s=0.01)
        metrics.database_call(kind="write", duration_s=0.001)
    return round((time.perf_counter() - began) / tasks * 1e6, 2)


def main() -> None:
    """Alternate runs without and with metrics; print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000, help="independent tasks in each run")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="slots per worker")
    parser.add_argument("--reps", type=int, default=2, help="runs of each mode, alternated")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for each run")
    parser.add_argument("--first", choices=["off", "on"], default="off", help="mode of the first run")
    parser.add_argument(
        "--scrape-interval", type=float, default=1.0, help="seconds between scrapes (Prometheus: 15-60)"
    )
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    # The order flips every repetition: on a shared machine the load drifts, and whichever mode
    # always ran second would carry the drift.
    order = ("off", "on") if args.first == "off" else ("on", "off")
    for rep in range(args.reps):
        for mode in order if rep % 2 == 0 else order[::-1]:
            runs[mode].append(one_run(args, metrics=mode == "on"))

    def median(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[mode] if r.get(key) is not None))

    rate_off, rate_on = median("off", "tasks_per_s_attempts"), median("on", "tasks_per_s_attempts")
    cpu_off, cpu_on = median("off", "treadle_cpu_ms_per_task"), median("on", "treadle_cpu_ms_per_task")
    cost_pct = round((rate_off - rate_on) / rate_off * 100, 1) if rate_off else None
    emit(
        {
            "benchmark": "metrics_overhead",
            "backend": "postgresql",
            "settings": vars(args),
            "machine": machine(),
            "tasks_per_s": {"metrics_off": rate_off, "metrics_on": rate_on},
            "treadle_cpu_ms_per_task": {"metrics_off": cpu_off, "metrics_on": cpu_on},
            "throughput_cost_pct": cost_pct,
            "hook_cost_us_per_task": hook_cost_us_per_task(args.tasks),
            "cpu_cost_pct": round((cpu_on - cpu_off) / cpu_off * 100, 1) if cpu_off else None,
            "every_success_counted": all(r["successes_counted_by_metrics"] == args.tasks for r in runs["on"]),
            "runs": runs,
            "target": {"throughput_cost_pct_below": 5},
            "meets_target": cost_pct is not None and cost_pct < 5,
        }
    )


if __name__ == "__main__":
    main()
