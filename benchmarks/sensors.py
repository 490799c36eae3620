"""Sensors do not hold slots: other tasks' ready-to-started latency with 100 sensors poking.

One worker with `--concurrency` slots (2) and one scheduler on PostgreSQL. First, waves of
`--wave` independent no-op tasks run alone (the baseline); then a run of `--sensors` sensors
(100) that poke every `--poke-interval` seconds (1) and never find their condition, and, once
they all poke, the same waves again. For each wave task the latency is its `started_at` minus
its `queued_at` (database times). Prints p50 / p99 / max of both phases and the p99 difference
(target: at most 20 ms), with how many pokes the sensors made per second meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import textwrap
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
    percentile,
    pg_database,
    print_log_tails,
    treadle_env,
    wait_for,
)

from treadle.engine.runs import trigger_run
from treadle.store.database import Database

WAVE_DAG, SENSOR_DAG = "bench_sensor_wave", "bench_sensor_pokes"


def dag_source(wave: int, sensors: int, poke_interval: float) -> str:
    """A DAG of `wave` no-ops and a DAG of `sensors` sensors that never find their condition."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        from treadle import dag, sensor, task


        @task
        def noop() -> None:
            return None


        @sensor(poke_interval={poke_interval}, timeout=3600)
        def never() -> bool:
            return False


        @dag(dag_id="{WAVE_DAG}")
        def {WAVE_DAG}() -> None:
            for _ in range({wave}):
                noop()


        @dag(dag_id="{SENSOR_DAG}")
        def {SENSOR_DAG}() -> None:
            for _ in range({sensors}):
                never()
        """
    )


def drive_waves(
    db: Database,
    conn: psycopg.Connection[Any],
    runs: int,
    pause_s: float,
    timeout: float,
    procs: Processes,
    logs: list[Path],
) -> list[str]:
    """Trigger `runs` wave runs one after another (each once the previous ended); their ids."""
    ids = []
    for _ in range(runs):
        run_id = trigger_run(db, WAVE_DAG, triggered_by="bench-sensors").run_id
        ids.append(run_id)
        deadline = time.monotonic() + timeout
        while True:
            row = conn.execute("SELECT state FROM dag_runs WHERE run_id = %s", (run_id,)).fetchone()
            if row and row[0] in ("success", "failed"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} did not finish in {timeout} s")
            check_alive(procs, logs)
            time.sleep(0.01)
        time.sleep(pause_s)
    return ids


def latencies(conn: psycopg.Connection[Any], run_ids: list[str]) -> list[float]:
    """started_at - queued_at (seconds) of the first attempts of the given runs."""
    rows = conn.execute(
        "SELECT queued_at, started_at FROM task_instances WHERE run_id = ANY(%s) AND attempt = 1",
        (run_ids,),
    ).fetchall()
    return [(s - q).total_seconds() for q, s in rows if q is not None and s is not None]


def pokes(conn: psycopg.Connection[Any], run_id: str) -> int:
    """Rescheduled attempts of the sensor run so far."""
    row = conn.execute(
        "SELECT count(*) FROM task_attempts WHERE run_id = %s AND outcome = 'rescheduled'", (run_id,)
    ).fetchone()
    return int(row[0]) if row else 0


def stats_ms(values: list[float]) -> dict[str, Any]:
    """p50 / p99 / max in milliseconds, and the count."""
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "p50_ms": round(statistics.median(values) * 1000, 2),
        "p90_ms": round(percentile(values, 90) * 1000, 2),
        "p99_ms": round(percentile(values, 99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sensors", type=int, default=100, help="sensors poking at once")
    parser.add_argument("--poke-interval", type=float, default=1.0, help="seconds between pokes")
    parser.add_argument("--concurrency", type=int, default=2, help="slots of the one worker")
    parser.add_argument(
        "--scheduler-tick",
        type=float,
        default=0.5,
        help="the scheduler's maintenance pass interval, which promotes due pokes (seconds)",
    )
    parser.add_argument(
        "--prefetch", type=int, default=None, help="the worker's --prefetch (default: its own)"
    )
    parser.add_argument("--wave", type=int, default=1, help="no-op tasks per wave run")
    parser.add_argument("--waves", type=int, default=200, help="wave runs per phase")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between wave runs")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for one run")
    args = parser.parse_args()

    load_before = os.getloadavg()
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_sensors") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "sensors.py").write_text(dag_source(args.wave, args.sensors, args.poke_interval))
        env = treadle_env(
            database_url=url,
            dags_folder=folder,
            home=root / "home",
            TREADLE_SCHEDULER_TICK_SECONDS=str(args.scheduler_tick),
        )
        logs = [root / "worker.log", root / "scheduler.log"]
        db = Database(url, application_name="treadle-bench")
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env)
            prefetch = [] if args.prefetch is None else ["--prefetch", str(args.prefetch)]
            procs.start(["worker", "--concurrency", str(args.concurrency), *prefetch], env, logs[0])
            procs.start(["scheduler"], env, logs[1])
            wait_for("the worker", lambda: log_mentions(logs[0], '"worker.started"'), timeout=60)
            with psycopg.connect(url, autocommit=True) as conn:
                drive_waves(db, conn, 5, args.pause, args.timeout, procs, logs)  # warm-up
                alone = drive_waves(db, conn, args.waves, args.pause, args.timeout, procs, logs)
                sensing = trigger_run(db, SENSOR_DAG, triggered_by="bench-sensors").run_id
                wait_for(
                    "every sensor to poke twice",
                    lambda: pokes(conn, sensing) >= 2 * args.sensors,
                    timeout=args.timeout * 5,
                )
                before, began = pokes(conn, sensing), time.monotonic()
                beside = drive_waves(db, conn, args.waves, args.pause, args.timeout, procs, logs)
                poke_rate = (pokes(conn, sensing) - before) / (time.monotonic() - began)
                baseline, loaded = stats_ms(latencies(conn, alone)), stats_ms(latencies(conn, beside))
                states = dict(
                    conn.execute(
                        "SELECT state, count(*) FROM task_instances WHERE run_id = %s GROUP BY state",
                        (sensing,),
                    ).fetchall()
                )
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()
            db.dispose()
    delay = round(loaded.get("p99_ms", 1e9) - baseline.get("p99_ms", 0), 2)
    emit(
        {
            "benchmark": "sensors",
            "backend": "postgresql",
            "settings": {
                "sensors": args.sensors,
                "poke_interval_s": args.poke_interval,
                "concurrency": args.concurrency,
                "prefetch": "worker default" if args.prefetch is None else args.prefetch,
                "scheduler_tick_s": args.scheduler_tick,
                "wave_size": args.wave,
                "waves_per_phase": args.waves,
            },
            "machine": machine(),
            "loadavg_1_5_15": {
                "before": [round(x, 2) for x in load_before],
                "after": [round(x, 2) for x in os.getloadavg()],
            },
            "ready_to_started_alone": baseline,
            "ready_to_started_beside_sensors": loaded,
            "p99_delay_ms": delay,
            "pokes_per_s": round(poke_rate, 1),
            "sensor_states": states,
            "target": {"p99_delay_ms_at_most": 20},
            "meets_target": delay <= 20,
        }
    )


if __name__ == "__main__":
    main()
