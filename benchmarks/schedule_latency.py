"""Schedule-to-start latency: many DAGs on a 1-second interval, one scheduler, real workers.

`--dags` DAGs, each of one no-op task on `schedule=timedelta(seconds=1)` (catchup off), fire
on every whole second. They are registered, then paused (one transaction) before any scheduler
runs; once the scheduler leads and the workers are up they are all unpaused in ONE
transaction. With catchup off the first pass after unpausing creates only the latest due slot
per DAG; the first `--skip` seconds after the unpause are left out so that pass does not count.

For every slot in the window (a slot is a whole second; the run's `data_interval_end` is its
nominal fire time) the figures, all from the database clock:

* start delay: the run's first task `started_at` (the worker's claim) - `data_interval_end`
  (target: p99 < 100 ms);
* fire delay: the run's `created_at` (the firing transaction's clock) - `data_interval_end`;
* per DAG, every whole second of the window must have exactly one run: missed and duplicated
  slots are counted.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    CpuMeter,
    Processes,
    cli,
    code_drift,
    code_state,
    count_in_logs,
    cpu_seconds,
    dist_ms,
    emit,
    log_mentions,
    machine,
    pg_database,
    print_log_tails,
    probe_summary,
    set_paused_many,
    slot_audit,
    start_probed_scheduler,
    treadle_env,
    wait_db_time,
    wait_for,
    whole_second_after,
    write_scheduled_dags,
)

PREFIX = "bench_sl"


def window_rows(conn: psycopg.Connection[Any], start: datetime, end: datetime) -> list[tuple[Any, ...]]:
    """(dag_id, data_interval_end, created_at, first started_at, tasks) of scheduled runs in a window."""
    return conn.execute(
        "SELECT r.dag_id, r.data_interval_end, r.created_at, min(t.started_at), count(t.*) "
        "FROM dag_runs r LEFT JOIN task_instances t ON t.run_id = r.run_id "
        "WHERE r.run_type = 'scheduled' AND r.dag_id LIKE %s "
        "AND r.data_interval_end >= %s AND r.data_interval_end < %s "
        "GROUP BY r.run_id, r.dag_id, r.data_interval_end, r.created_at",
        (f"{PREFIX}_%", start, end),
    ).fetchall()


def first_pass(
    conn: psycopg.Connection[Any], unpaused_at: datetime, window_start: datetime
) -> dict[str, Any]:
    """What the scheduler created between the unpause and the window (left out of the figures)."""
    rows = conn.execute(
        "SELECT data_interval_end, count(*), min(created_at), max(created_at) FROM dag_runs "
        "WHERE run_type = 'scheduled' AND data_interval_end < %s GROUP BY data_interval_end "
        "ORDER BY data_interval_end",
        (window_start,),
    ).fetchall()
    return {
        "runs_before_window": sum(r[1] for r in rows),
        "by_slot": [
            {
                "slot_after_unpause_s": round((end - unpaused_at).total_seconds(), 3),
                "runs": n,
                "created_after_slot_ms": [
                    round((lo - end).total_seconds() * 1000, 1),
                    round((hi - end).total_seconds() * 1000, 1),
                ],
            }
            for end, n, lo, hi in rows
        ],
    }


def fired_log(path: Path) -> list[tuple[datetime, int]]:
    """(host time logged, runs) of each "runs created" line of a scheduler log (after the commit)."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if '"scheduler.fired"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        found.append((datetime.fromisoformat(entry["ts"]), int(entry.get("runs", 0))))
    return found


def passed_over_log(path: Path, start: datetime, end: datetime) -> int:
    """Slots the scheduler logged as passed over (catchup off, it was late) in a time window."""
    count = 0
    for line in path.read_text(errors="replace").splitlines():
        if '"scheduler.slots_skipped"' in line:
            entry = json.loads(line)
            if start <= datetime.fromisoformat(entry["ts"]) < end + timedelta(seconds=2):
                count += int(entry.get("count", 0))
    return count


def per_slot(rows: list[tuple[Any, ...]], fired: list[tuple[datetime, int]]) -> dict[str, Any]:
    """Where a slot's time goes: firing transaction start, its commit (logged), first and last claim.

    Per slot (all DAGs together): created_at - slot (the firing transaction's clock), the
    scheduler's "runs created" log line - created_at (about the transaction's length; host
    clock, same machine as the database), first and last claim - slot.
    """
    slots: dict[datetime, list[tuple[Any, ...]]] = {}
    for r in rows:
        slots.setdefault(r[1], []).append(r)
    fire, txn, first, last, batches = [], [], [], [], []
    for slot, group in sorted(slots.items()):
        created = min(r[2] for r in group)
        starts = sorted(r[3] for r in group if r[3] is not None)
        fire.append((max(r[2] for r in group) - slot).total_seconds())
        logged = [(ts, n) for ts, n in fired if ts >= created and (ts - created).total_seconds() < 5]
        if logged:
            txn.append((logged[0][0] - created).total_seconds())
        batches.append(len({r[2] for r in group}))
        if starts:
            first.append((starts[0] - slot).total_seconds())
            last.append((starts[-1] - slot).total_seconds())
    return {
        "slots": len(slots),
        "firing_transactions_per_slot_max": max(batches, default=0),
        "slot_to_created": dist_ms(fire),
        "created_to_commit_logged": dist_ms(txn),
        "slot_to_first_claim": dist_ms(first),
        "slot_to_last_claim": dist_ms(last),
    }


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dags", type=int, default=100, help="DAGs, each on a 1-second interval")
    parser.add_argument("--seconds", type=int, default=60, help="length of the measured window")
    parser.add_argument("--skip", type=float, default=2.0, help="seconds after the unpause left out")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=64, help="slots per worker")
    parser.add_argument("--per-file", type=int, default=25, help="DAGs per generated file")
    parser.add_argument(
        "--probe", action="store_true", help="time the scheduler loop's phases (see _common.py)"
    )
    parser.add_argument("--keep-logs", type=Path, help="copy the treadle logs into this folder")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for start-up / drain")
    args = parser.parse_args()

    procs = Processes()
    code_at_start = code_state()
    started_wall = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_sl") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        ids = write_scheduled_dags(
            folder, prefix=PREFIX, count=args.dags, schedule="timedelta(seconds=1)", per_file=args.per_file
        )
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / f"worker{i}.log" for i in range(args.workers)] + [root / "scheduler.log"]
        try:
            cli(["db", "upgrade"], env)
            began = time.monotonic()
            cli(["dags", "sync"], env, timeout=args.timeout)
            sync_s = time.monotonic() - began
            set_paused_many(url, ids, paused=True)  # before any scheduler runs: nothing fires yet
            workers = [
                procs.start(["worker", "--concurrency", str(args.concurrency)], env, log) for log in logs[:-1]
            ]
            probe = root / "probe.jsonl"
            if args.probe:
                scheduler = start_probed_scheduler(procs, env, logs[-1], probe)
            else:
                scheduler = procs.start(["scheduler"], env, logs[-1])
            for log in logs[:-1]:
                wait_for(
                    "the workers",
                    lambda log=log: log_mentions(log, '"worker.started"'),
                    timeout=args.timeout,
                )
            wait_for(
                "the scheduler to lead",
                lambda: log_mentions(logs[-1], '"scheduler.leader_acquired"'),
                timeout=args.timeout,
            )
            with psycopg.connect(url, autocommit=True) as conn:
                unpaused_at = set_paused_many(url, ids, paused=False)
                window_start = whole_second_after(unpaused_at + timedelta(seconds=args.skip))
                window_end = window_start + timedelta(seconds=args.seconds)  # exclusive
                wait_db_time(conn, window_start, procs, logs)
                meter = CpuMeter(url, [p.pid for p in procs.procs])
                cpu_sched0 = cpu_seconds([scheduler.pid])
                cpu_work0 = cpu_seconds([w.pid for w in workers])
                load0 = os.getloadavg()
                wait_db_time(conn, window_end, procs, logs)
                cpu_sched = cpu_seconds([scheduler.pid]) - cpu_sched0
                cpu_work = cpu_seconds([w.pid for w in workers]) - cpu_work0
                cpu = meter.figures(max(args.dags * args.seconds, 1))
                load1 = os.getloadavg()
                # Drain: the window's last runs need their tasks claimed.
                deadline = time.monotonic() + args.timeout
                while True:
                    rows = window_rows(conn, window_start, window_end)
                    if all(r[3] is not None for r in rows) or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                before = first_pass(conn, unpaused_at, window_start)
            fired = fired_log(logs[-1])
            errors = count_in_logs(logs[-1:], '"scheduler.step_error"')
            passed_over = passed_over_log(logs[-1], window_start, window_end)
            expected = [window_start + timedelta(seconds=i) for i in range(args.seconds)]
            audit = slot_audit([(r[0], r[1]) for r in rows], ids, expected)
            extra: dict[str, Any] = {}
            if args.probe:
                created = {}
                for r in rows:
                    created[r[1]] = max(created.get(r[1], r[2]), r[2])
                late = sorted(
                    {t for t, c in created.items() if (c - t).total_seconds() > 0.1}
                    | {t for t in expected if t not in created}
                )
                extra["scheduler_probe"] = probe_summary(
                    probe, since=window_start, until=window_end, late=late
                )
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in [*logs, probe]:
                    if log.exists():
                        shutil.copy(log, args.keep_logs / log.name)
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()

    start_delay = [(r[3] - r[1]).total_seconds() for r in rows if r[3] is not None]
    fire_delay = [(r[2] - r[1]).total_seconds() for r in rows]
    not_started = sum(1 for r in rows if r[3] is None)
    start = dist_ms(start_delay)
    p99 = start.get("p99_ms", math.inf)
    emit(
        {
            "benchmark": "schedule_latency",
            "backend": "postgresql",
            "settings": {
                "dags": args.dags,
                "schedule": "every 1 s (interval, catchup off)",
                "window_s": args.seconds,
                "skipped_after_unpause_s": args.skip,
                "workers": args.workers,
                "concurrency_per_worker": args.concurrency,
                "scheduler_tick_s": float(env["TREADLE_SCHEDULER_TICK_SECONDS"]),
            },
            "code": code_drift(code_at_start),
            "machine": {**machine(), "loadavg_1m_before_after": [round(load0[0], 2), round(load1[0], 2)]},
            "sync_wall_s": round(sync_s, 2),
            "unpaused_at_db": unpaused_at.astimezone(UTC).isoformat(),
            "window_db": [window_start.isoformat(), window_end.isoformat()],
            "first_pass_after_unpause": before,
            "runs_in_window": len(rows),
            "start_delay": start,
            "fire_delay": dist_ms(fire_delay),
            "not_started": not_started,
            "scheduler_step_errors": errors,
            "per_slot": per_slot(rows, fired),
            "slots": {**audit, "passed_over_logged_in_window": passed_over},
            "cpu_in_window": {
                "scheduler_cpu_s": round(cpu_sched, 2),
                "workers_cpu_s": round(cpu_work, 2),
                **cpu,
                "per": "expected run",
            },
            **extra,
            "wall_s": round(time.monotonic() - started_wall, 1),
            "target": {"start_delay_p99_ms_below": 100, "missed": 0, "duplicated": 0},
            "meets_target": {
                "start_delay_p99": p99 < 100 and not_started == 0 and errors == 0,
                "every_slot_once": audit["missed"] == 0 and audit["duplicated"] == 0,
            },
        }
    )


if __name__ == "__main__":
    main()
