"""Live schedules while a large backfill drains: PostgreSQL, one scheduler, real workers.

`--live-dags` DAGs, each of one no-op task on `schedule=timedelta(seconds=1)` (catchup off),
and one backfill DAG on a 1-minute interval whose `start_date` / `end_date` lie in the past (so
the scheduler never fires it) with a chain of `--backfill-tasks` tasks that each sleep
`--task-sleep` seconds. The live DAGs are registered paused and unpaused in ONE transaction
once the scheduler leads and the workers are up; the first `--skip` seconds after that are left
out. Then two windows, one after the other:

* baseline: `--seconds` seconds of live schedules alone;
* drain: `treadle backfill BACKFILL_DAG --from .. --to .. --max-active N --no-wait` over
  `--intervals` intervals; the window runs from the backfill's creation until it is done (or
  `--drain-timeout` seconds).

For every live slot in a window (a whole second; the run's `data_interval_end`), all from the
database clock: start delay = the run's first task `started_at` - `data_interval_end`
(target: p99 < 250 ms during the drain), split into fire delay (`created_at` - slot) and
queue wait (`started_at` - `queued_at`); missed and duplicated slots per DAG. For the backfill:
runs done, drain seconds (backfill created -> ended) and runs/s. To see whether worker slots
ran out, the most task instances running at once (from `started_at` / `ended_at`) against the
slots there are. `--live-priority N` gives the live tasks `priority_weight=N` (the default 1 is
the backfill tasks' weight too).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    Processes,
    check_alive,
    cli,
    code_state,
    count_in_logs,
    cpu_seconds,
    db_clock,
    dist_ms,
    emit,
    log_mentions,
    machine,
    pg_backend_pids,
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
)

PREFIX = "bench_bfl"
BACKFILL_DAG = "bench_bfl_backfill"
#: First logical date of the backfill (the backfill DAG's start_date; long past).
BACKFILL_START = datetime(2025, 1, 1, tzinfo=UTC)
TARGET_P99_MS = 250


def start_scheduler(procs: Processes, env: dict[str, str], log_path: Path, probe: Path | None) -> Any:
    """`treadle scheduler`, its phases (backfill drain included) timed into `probe` when given."""
    if probe is None:
        return procs.start(["scheduler"], env, log_path)
    return start_probed_scheduler(procs, env, log_path, probe)


def live_source(count: int, priority: int) -> str:
    """`count` DAGs of one no-op task on a 1-second interval, built in a loop."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        from datetime import timedelta

        from treadle import dag, task


        @task(priority_weight={priority})
        def noop() -> None:
            return None


        def build(dag_id: str):
            @dag(dag_id=dag_id, schedule=timedelta(seconds=1), catchup=False)
            def flow() -> None:
                noop()

            return flow


        for _i in range({count}):
            globals()[f"dag_{{_i}}"] = build(f"{PREFIX}_{{_i:05d}}")
        """
    )


def backfill_source(tasks: int, sleep_s: float, intervals: int, max_active: int) -> str:
    """The backfill DAG: a chain of `tasks` sleeping tasks, 1-minute interval, entirely in the past."""
    end = BACKFILL_START + timedelta(minutes=intervals + 60)
    chain = "\n".join(f"    value = step(value, {i})" for i in range(1, tasks))
    return f"""\
from __future__ import annotations

import time
from datetime import timedelta

from treadle import dag, task


@task
def step(value: int, index: int) -> int:
    time.sleep({sleep_s!r})
    return value + index


@dag(
    dag_id="{BACKFILL_DAG}",
    schedule=timedelta(minutes=1),
    start_date="{BACKFILL_START.isoformat()}",
    end_date="{end.isoformat()}",
    catchup=False,
    max_active_runs={max(16, max_active)},
)
def {BACKFILL_DAG}() -> None:
    value = step(0, 0)
{chain}
"""


def live_rows(conn: psycopg.Connection[Any], start: datetime, end: datetime) -> list[tuple[Any, ...]]:
    """(dag_id, data_interval_end, created_at, first started_at, its queued_at) of live runs in a window."""
    return conn.execute(
        "SELECT DISTINCT ON (r.run_id) r.dag_id, r.data_interval_end, r.created_at, t.started_at, "
        "t.queued_at FROM dag_runs r LEFT JOIN task_instances t ON t.run_id = r.run_id "
        "WHERE r.run_type = 'scheduled' AND r.dag_id LIKE %s AND r.dag_id <> %s "
        "AND r.data_interval_end >= %s AND r.data_interval_end < %s "
        "ORDER BY r.run_id, t.started_at NULLS LAST",
        (f"{PREFIX}_%", BACKFILL_DAG, start, end),
    ).fetchall()


def drain_live(
    conn: psycopg.Connection[Any], start: datetime, end: datetime, timeout: float
) -> list[tuple[Any, ...]]:
    """The window's live runs, once each has its first task started (or `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = live_rows(conn, start, end)
        if all(r[3] is not None for r in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def window_figures(
    rows: list[tuple[Any, ...]], ids: list[str], start: datetime, end: datetime
) -> dict[str, Any]:
    """Start delay (with its split) and the slot audit of one window's live runs."""
    start_delay = [(r[3] - r[1]).total_seconds() for r in rows if r[3] is not None]
    fire_delay = [(r[2] - r[1]).total_seconds() for r in rows]
    queue_wait = [(r[3] - r[4]).total_seconds() for r in rows if r[3] is not None and r[4] is not None]
    seconds = int((end - start).total_seconds())
    expected = [start + timedelta(seconds=i) for i in range(seconds)]
    over = [
        r
        for r in rows
        if r[3] is not None and r[4] is not None and (r[3] - r[1]).total_seconds() * 1000 > TARGET_P99_MS
    ]
    late = sorted(r[1] for r in over)
    return {
        "window_db": [start.isoformat(), end.isoformat()],
        "window_s": seconds,
        "runs": len(rows),
        "start_delay": dist_ms(start_delay),
        "fire_delay": dist_ms(fire_delay),
        "queue_wait": dist_ms(queue_wait),
        "not_started": sum(1 for r in rows if r[3] is None),
        "runs_over_250ms": len(late),
        # Of those, the part that dominated: the firing transaction began late, or the task waited.
        "runs_over_250ms_mostly": {
            "fired_late": sum(1 for r in over if (r[2] - r[1]) >= (r[3] - r[4])),
            "queued_long": sum(1 for r in over if (r[2] - r[1]) < (r[3] - r[4])),
        },
        "slots_with_runs_over_250ms": sorted({t.isoformat() for t in late})[:20],
        "slots": slot_audit([(r[0], r[1]) for r in rows], ids, expected),
    }


def late_slots(rows: list[tuple[Any, ...]]) -> list[datetime]:
    """Slots whose last firing transaction began more than 100 ms after the slot."""
    created: dict[datetime, datetime] = {}
    for r in rows:
        created[r[1]] = max(created.get(r[1], r[2]), r[2])
    return sorted(t for t, c in created.items() if (c - t).total_seconds() > 0.1)


def backfill_state(conn: psycopg.Connection[Any], backfill_id: int) -> tuple[Any, ...]:
    """(state, handled, total, created_at, ended_at) of a backfill."""
    row = conn.execute(
        "SELECT state, handled, total, created_at, ended_at FROM backfills WHERE id = %s", (backfill_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


def backfill_figures(conn: psycopg.Connection[Any], backfill_id: int, until: datetime) -> dict[str, Any]:
    """Runs of the backfill by state, drain time and rate, and its tasks' queue waits."""
    state, handled, total, created, ended = backfill_state(conn, backfill_id)
    by_state = dict(
        conn.execute(
            "SELECT state, count(*) FROM dag_runs WHERE backfill_id = %s GROUP BY state", (backfill_id,)
        ).fetchall()
    )
    first_created, last_ended = conn.execute(
        "SELECT min(created_at), max(ended_at) FROM dag_runs WHERE backfill_id = %s", (backfill_id,)
    ).fetchone() or (None, None)
    waits = [
        (s - q).total_seconds()
        for q, s in conn.execute(
            "SELECT t.queued_at, t.started_at FROM task_instances t JOIN dag_runs r ON r.run_id = t.run_id "
            "WHERE r.backfill_id = %s AND t.started_at IS NOT NULL AND t.queued_at IS NOT NULL",
            (backfill_id,),
        ).fetchall()
    ]
    done = int(by_state.get("success", 0)) + int(by_state.get("failed", 0))
    drain_s = ((ended or until) - created).total_seconds()
    return {
        "state": state,
        "intervals_handled": f"{handled}/{total}",
        "runs_by_state": by_state,
        "runs_done": done,
        "drain_s": round(drain_s, 2),
        "drain_ended": ended is not None,
        "runs_per_s": round(done / drain_s, 2) if drain_s > 0 else None,
        "created_to_first_run_ms": round((first_created - created).total_seconds() * 1000, 1)
        if first_created
        else None,
        "last_run_ended_to_done_ms": round((ended - last_ended).total_seconds() * 1000, 1)
        if ended and last_ended
        else None,
        "task_queue_wait": dist_ms(waits),
    }


def concurrency(
    conn: psycopg.Connection[Any], start: datetime, end: datetime, now: datetime
) -> dict[str, Any]:
    """Most task instances running at once in a window, in all and by kind (live / backfill)."""
    rows = conn.execute(
        "SELECT t.started_at, coalesce(t.ended_at, %s), r.run_type FROM task_instances t "
        "JOIN dag_runs r ON r.run_id = t.run_id WHERE t.started_at IS NOT NULL "
        "AND t.started_at < %s AND coalesce(t.ended_at, %s) > %s",
        (now, end, now, start),
    ).fetchall()
    events: list[tuple[datetime, int, str]] = []
    for began, ended, kind in rows:
        events.append((max(began, start), 1, kind))
        events.append((min(ended, end), -1, kind))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    running = {"all": 0, "scheduled": 0, "backfill": 0}
    peak = dict(running)
    for _, delta, kind in events:
        for key in ("all", kind):
            if key in running:
                running[key] += delta
                peak[key] = max(peak[key], running[key])
    return {
        "max_running_tasks": peak["all"],
        "max_running_live": peak["scheduled"],
        "max_running_backfill": peak["backfill"],
    }


class CpuPhase:
    """CPU seconds of the scheduler, the workers (with their children) and the database's sessions."""

    def __init__(self, url: str, scheduler: int, workers: list[int]) -> None:
        self.url, self.scheduler, self.workers = url, scheduler, workers
        self.start = self._read()
        self.wall = time.monotonic()

    def _read(self) -> dict[str, Any]:
        return {
            "scheduler": cpu_seconds([self.scheduler]),
            "workers": cpu_seconds(self.workers),
            "pg": {pid: cpu_seconds([pid]) for pid in pg_backend_pids(self.url)},
        }

    def figures(self) -> dict[str, float]:
        """CPU seconds used since the phase began, and the wall seconds it lasted."""
        now = self._read()
        pg = sum(max(c - self.start["pg"].get(pid, 0.0), 0.0) for pid, c in now["pg"].items())
        return {
            "wall_s": round(time.monotonic() - self.wall, 1),
            "scheduler_cpu_s": round(now["scheduler"] - self.start["scheduler"], 2),
            "workers_cpu_s": round(now["workers"] - self.start["workers"], 2),
            "postgres_cpu_s": round(pg, 2),
        }


def load1() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--live-dags", type=int, default=20, help="DAGs, each on a 1-second interval")
    parser.add_argument("--seconds", type=int, default=20, help="length of the live-only baseline window")
    parser.add_argument("--skip", type=float, default=2.0, help="seconds after the unpause left out")
    parser.add_argument("--intervals", type=int, default=1000, help="intervals the backfill covers")
    parser.add_argument("--max-active", type=int, default=8, help="the backfill's --max-active")
    parser.add_argument("--backfill-tasks", type=int, default=2, help="tasks in a chain per backfill run")
    parser.add_argument("--task-sleep", type=float, default=0.05, help="seconds each backfill task sleeps")
    parser.add_argument("--live-priority", type=int, default=1, help="priority_weight of the live tasks")
    parser.add_argument(
        "--tick", type=float, default=0.5, help="TREADLE_SCHEDULER_TICK_SECONDS (the backfill drain's pace)"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=16, help="slots per worker")
    parser.add_argument(
        "--drain-timeout", type=float, default=150, help="most seconds the drain window lasts"
    )
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for start-up")
    parser.add_argument(
        "--probe", action="store_true", help="time the scheduler loop's phases (see _common.py)"
    )
    args = parser.parse_args()

    procs = Processes()
    started_wall = time.monotonic()
    loads = {"at_start": load1()}
    ids = [f"{PREFIX}_{i:05d}" for i in range(args.live_dags)]
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_bfl") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "live.py").write_text(live_source(args.live_dags, args.live_priority))
        (folder / "backfill.py").write_text(
            backfill_source(args.backfill_tasks, args.task_sleep, args.intervals, args.max_active)
        )
        env = treadle_env(
            database_url=url,
            dags_folder=folder,
            home=root / "home",
            TREADLE_SCHEDULER_TICK_SECONDS=str(args.tick),
        )
        logs = [root / f"worker{i}.log" for i in range(args.workers)] + [root / "scheduler.log"]
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env, timeout=args.timeout)
            set_paused_many(url, ids, paused=True)  # before any scheduler runs: nothing fires yet
            workers = [
                procs.start(["worker", "--concurrency", str(args.concurrency)], env, log) for log in logs[:-1]
            ]
            probe = root / "probe.jsonl" if args.probe else None
            scheduler = start_scheduler(procs, env, logs[-1], probe)
            for log in logs[:-1]:
                wait_for(
                    "the workers", lambda log=log: log_mentions(log, '"worker.started"'), timeout=args.timeout
                )
            wait_for(
                "the scheduler to lead",
                lambda: log_mentions(logs[-1], '"scheduler.leader_acquired"'),
                timeout=args.timeout,
            )
            with psycopg.connect(url, autocommit=True) as conn:
                unpaused_at = set_paused_many(url, ids, paused=False)
                base_start = whole_second_after(unpaused_at + timedelta(seconds=args.skip))
                base_end = base_start + timedelta(seconds=args.seconds)  # exclusive
                wait_db_time(conn, base_start, procs, logs)
                cpu = CpuPhase(url, scheduler.pid, [w.pid for w in workers])
                loads["baseline_start"] = load1()
                wait_db_time(conn, base_end, procs, logs)
                cpu_base = cpu.figures()
                loads["baseline_end"] = load1()

                last = BACKFILL_START + timedelta(minutes=args.intervals - 1)
                reason = f"benchmark: {args.intervals} intervals while live schedules run"
                cpu = CpuPhase(url, scheduler.pid, [w.pid for w in workers])
                made = cli(
                    [
                        "backfill",
                        BACKFILL_DAG,
                        "--from",
                        BACKFILL_START.isoformat(),
                        "--to",
                        last.isoformat(),
                        "--reason",
                        reason,
                        "--max-active",
                        str(args.max_active),
                        "--json",
                    ],
                    env,
                    timeout=args.timeout,
                )
                backfill_id = int(json.loads(made.stdout)["id"])
                created = backfill_state(conn, backfill_id)[3]
                drain_start = whole_second_after(created)
                deadline = time.monotonic() + args.drain_timeout
                loads["drain_start"] = load1()
                while True:
                    check_alive(procs, logs)
                    state = backfill_state(conn, backfill_id)
                    if state[0] != "running" or time.monotonic() > deadline:
                        break
                    time.sleep(0.25)
                cpu_drain = cpu.figures()
                loads["drain_end"] = load1()
                drain_end = (state[4] or db_clock(conn)).replace(microsecond=0)
                base_rows = drain_live(conn, base_start, base_end, args.timeout)
                drain_rows = drain_live(conn, drain_start, drain_end, args.timeout)
                now = db_clock(conn)
                backfill = backfill_figures(conn, backfill_id, now)
                busy = {
                    "baseline": concurrency(conn, base_start, base_end, now),
                    "drain": concurrency(conn, drain_start, drain_end, now),
                }
            errors = count_in_logs(logs[-1:], '"scheduler.step_error"')
            extra: dict[str, Any] = {}
            if probe is not None:
                extra["scheduler_probe"] = {
                    name: probe_summary(probe, since=lo, until=hi, late=late_slots(rows))
                    for name, lo, hi, rows in (
                        ("baseline", base_start, base_end, base_rows),
                        ("drain", drain_start, drain_end, drain_rows),
                    )
                }
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()

    baseline = window_figures(base_rows, ids, base_start, base_end)
    during = window_figures(drain_rows, ids, drain_start, drain_end)
    p99 = during["start_delay"].get("p99_ms", math.inf)
    slots = args.workers * args.concurrency
    parts = {
        "live_p99_below_target": p99 < TARGET_P99_MS and during["not_started"] == 0,
        "no_missed_or_duplicated_live_slot": during["slots"]["missed"] == 0
        and during["slots"]["duplicated"] == 0,
        "backfill_drained_within_timeout": backfill["drain_ended"],
        "no_scheduler_step_errors": errors == 0,
    }
    emit(
        {
            "benchmark": "backfill_live",
            "backend": "postgresql",
            "settings": {
                "live_dags": args.live_dags,
                "live_schedule": "every 1 s (interval, catchup off), one no-op task",
                "live_priority_weight": args.live_priority,
                "baseline_window_s": args.seconds,
                "skipped_after_unpause_s": args.skip,
                "backfill_intervals": args.intervals,
                "backfill_max_active": args.max_active,
                "backfill_run": f"chain of {args.backfill_tasks} tasks sleeping {args.task_sleep} s",
                "workers": args.workers,
                "concurrency_per_worker": args.concurrency,
                "worker_slots": slots,
                "drain_timeout_s": args.drain_timeout,
                "scheduler_tick_s": float(env["TREADLE_SCHEDULER_TICK_SECONDS"]),
            },
            "code": code_state(),
            "machine": {**machine(), "loadavg_1m": loads},
            "live_baseline": {**baseline, **busy["baseline"], "cpu": cpu_base},
            "live_during_drain": {**during, **busy["drain"], "cpu": cpu_drain},
            "backfill": backfill,
            "scheduler_step_errors": errors,
            **extra,
            "wall_s": round(time.monotonic() - started_wall, 1),
            "target": {"during_drain_live_start_delay_p99_ms_below": TARGET_P99_MS},
            "meets_target_parts": parts,
            "meets_target": all(parts.values()),
        }
    )


if __name__ == "__main__":
    main()
