"""Many 1-second schedules: how late each slot fires and starts (`treadle bench --only schedules`).

`dags` DAGs, each of one no-op task on `schedule=timedelta(seconds=1)` (catchup off: a slot is
a whole second; cron's resolution is a minute, so a 1-second schedule is an interval), fire on
every whole second. They are registered, then paused in one transaction before any scheduler
runs; once the scheduler leads and the workers are up they are unpaused in ONE transaction. With
catchup off the first pass after unpausing creates only the latest due slot per DAG; the first
`skip_s` seconds after the unpause are left out so that pass does not count.

For every slot in the window (the run's `data_interval_end` is its nominal fire time), all from
the database clock:

* fire delay: the run's `created_at` (the firing transaction's clock, taken at its start) -
  `data_interval_end`;
* start delay: the run's first task `started_at` (the worker's claim) - `data_interval_end`
  (target: p99 < 100 ms); with fewer slots than DAGs it includes waiting for a slot;
* per DAG, every whole second of the window must have exactly one run: missed and duplicated
  slots are counted.

PostgreSQL: one scheduler and `workers` workers. SQLite: one `treadle standalone`.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from treadle.bench.db import Rows
from treadle.bench.harness import CpuMeter, cli, count_in_logs, cpu_seconds, dist_ms, migrate, wait_for
from treadle.bench.probe import probe_summary
from treadle.bench.scheduling import (
    QUIET,
    STARTUP_S,
    Cluster,
    fired_log,
    log_events,
    seconds_from,
    set_paused_many,
    slot_audit,
    whole_second_after,
    write_scheduled_dags,
)
from treadle.store.tables import dag_runs, task_instances

PREFIX = "bench_sl"


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulesOptions:
    """How many 1-second schedules, for how long, on which processes."""

    dags: int = 100
    seconds: int = 60
    skip_s: float = 2.0
    workers: int = 2
    slots: int = 64
    per_file: int = 25
    #: Time the scheduler loop's phases (PostgreSQL: needs a separate scheduler process).
    probe: bool = False
    keep_logs: Path | None = None
    timeout_s: float = 60.0
    progress: Callable[[str], None] = QUIET


def measure_schedules(root: Path, url: str, options: SchedulesOptions) -> dict[str, Any]:
    """Run the schedules on a fresh database (`url`, empty); returns the figures."""
    if options.dags < 1 or options.seconds < 1:
        raise ValueError("the schedules workload needs at least one DAG and one second")
    began = time.monotonic()
    cluster = Cluster(root, url)
    if options.probe and cluster.is_sqlite:
        raise ValueError("--probe times a separate scheduler process: PostgreSQL only")
    ids = write_scheduled_dags(
        cluster.folder,
        prefix=PREFIX,
        count=options.dags,
        schedule="timedelta(seconds=1)",
        per_file=options.per_file,
    )
    probe = root / "probe.jsonl"
    try:
        migrate(cluster.url)
        synced = time.monotonic()
        cli(["dags", "sync"], cluster.env, timeout=STARTUP_S + 0.1 * options.dags)
        sync_s = time.monotonic() - synced
        set_paused_many(url, ids, paused=True)  # before any scheduler runs: nothing fires yet
        scheduler, workers = _start(cluster, options, probe)
        options.progress(f"schedules: {options.dags} DAGs every second for {options.seconds} s")
        measured = _window(cluster, ids, options, scheduler, workers)
        if options.probe:
            measured["scheduler_probe"] = _probe(probe, measured)
        if options.keep_logs:
            options.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in [*cluster.logs, probe]:
                if log.exists():
                    shutil.copy(log, options.keep_logs / log.name)
    except BaseException:
        cluster.dump_logs()
        raise
    finally:
        cluster.stop()
    return _figures(ids, options, measured, sync_s, began, cluster.is_sqlite)


def _start(cluster: Cluster, options: SchedulesOptions, probe: Path) -> tuple[int, list[int]]:
    """Start the processes; returns the scheduler's pid and the workers' (SQLite: standalone)."""
    slots = str(options.slots)
    if cluster.is_sqlite:
        pid = cluster.start("standalone", ["standalone", "--concurrency", slots]).pid
        cluster.wait_log("standalone", '"worker.started"', "treadle standalone", timeout=STARTUP_S)
        cluster.wait_log(
            "standalone", '"scheduler.leader_acquired"', "the scheduler to lead", timeout=STARTUP_S
        )
        return pid, []
    workers = [
        cluster.start(f"worker{i}", ["worker", "--concurrency", slots]).pid for i in range(options.workers)
    ]
    scheduler = cluster.start_scheduler("scheduler", probe=probe if options.probe else None).pid
    for i in range(options.workers):
        cluster.wait_log(f"worker{i}", '"worker.started"', "the workers", timeout=STARTUP_S)
    cluster.wait_log("scheduler", '"scheduler.leader_acquired"', "the scheduler to lead", timeout=STARTUP_S)
    return scheduler, workers


def _window(
    cluster: Cluster, ids: list[str], options: SchedulesOptions, scheduler: int, workers: list[int]
) -> dict[str, Any]:
    """Unpause, wait out the window, drain; returns the raw measurements."""
    bdb = cluster.bdb
    unpaused_at = set_paused_many(cluster.url, ids, paused=False)
    start = whole_second_after(unpaused_at + timedelta(seconds=options.skip_s))
    end = start + timedelta(seconds=options.seconds)  # exclusive
    bdb.wait_until(start, cluster.alive)
    meter = CpuMeter(None if cluster.is_sqlite else cluster.url, [p.pid for p in cluster.procs.procs])
    cpu_sched0, cpu_work0 = cpu_seconds([scheduler]), cpu_seconds(workers)
    load0 = os.getloadavg()[0]
    bdb.wait_until(end, cluster.alive)
    cpu_sched = cpu_seconds([scheduler]) - cpu_sched0
    cpu_work = cpu_seconds(workers) - cpu_work0
    cpu = meter.figures(max(options.dags * options.seconds, 1))
    load1 = os.getloadavg()[0]
    # Drain: the window's last runs need their tasks claimed.
    rows: Rows = []

    def drained() -> bool:
        nonlocal rows
        rows = window_rows(cluster, start, end)
        return all(r[3] is not None for r in rows)

    try:
        wait_for("the window's runs to start", drained, timeout=options.timeout_s, every=0.2)
    except TimeoutError:
        pass  # reported as not_started
    log = cluster.log("standalone" if cluster.is_sqlite else "scheduler")
    return {
        "unpaused_at": unpaused_at,
        "start": start,
        "end": end,
        "rows": rows,
        "first_pass": first_pass(cluster, unpaused_at, start),
        "fired": fired_log(log),
        "step_errors": count_in_logs([log], '"scheduler.step_error"'),
        "passed_over": passed_over_log(log, start, end),
        "cpu": {
            ("standalone_cpu_s" if cluster.is_sqlite else "scheduler_cpu_s"): round(cpu_sched, 2),
            **({} if cluster.is_sqlite else {"workers_cpu_s": round(cpu_work, 2)}),
            **cpu,
            "per": "expected run",
        },
        "load_1m_before_after": [round(load0, 2), round(load1, 2)],
    }


def window_rows(cluster: Cluster, start: datetime, end: datetime) -> Rows:
    """(dag_id, data_interval_end, created_at, first started_at, tasks) of scheduled runs in a window."""
    r, t = dag_runs, task_instances
    stmt = (
        sa.select(
            r.c.dag_id,
            r.c.data_interval_end,
            r.c.created_at,
            sa.func.min(t.c.started_at),
            sa.func.count(t.c.id),
        )
        .select_from(r.outerjoin(t, t.c.run_id == r.c.run_id))
        .where(
            r.c.run_type == "scheduled",
            r.c.dag_id.like(f"{PREFIX}_%"),
            r.c.data_interval_end >= start,
            r.c.data_interval_end < end,
        )
        .group_by(r.c.run_id, r.c.dag_id, r.c.data_interval_end, r.c.created_at)
    )
    return cluster.bdb.rows(stmt)


def first_pass(cluster: Cluster, unpaused_at: datetime, window_start: datetime) -> dict[str, Any]:
    """What the scheduler created between the unpause and the window (left out of the figures)."""
    r = dag_runs
    stmt = (
        sa.select(
            r.c.data_interval_end, sa.func.count(), sa.func.min(r.c.created_at), sa.func.max(r.c.created_at)
        )
        .where(r.c.run_type == "scheduled", r.c.data_interval_end < window_start)
        .group_by(r.c.data_interval_end)
        .order_by(r.c.data_interval_end)
    )
    rows = cluster.bdb.rows(stmt)
    return {
        "runs_before_window": sum(int(row[1]) for row in rows),
        "by_slot": [
            {
                "slot_after_unpause_s": round((end - unpaused_at).total_seconds(), 3),
                "runs": int(n),
                "created_after_slot_ms": [
                    round((lo - end).total_seconds() * 1000, 1),
                    round((hi - end).total_seconds() * 1000, 1),
                ],
            }
            for end, n, lo, hi in rows
        ],
    }


def passed_over_log(path: Path, start: datetime, end: datetime) -> int:
    """Slots the scheduler logged as passed over (catchup off, it was late) in a time window."""
    return sum(
        int(e.get("count", 0))
        for e in log_events(path, "scheduler.slots_skipped")
        if start <= datetime.fromisoformat(e["ts"]) < end + timedelta(seconds=2)
    )


def per_slot(rows: Rows, fired: list[tuple[datetime, int]]) -> dict[str, Any]:
    """Where a slot's time goes: firing transaction start, its commit (logged), first and last claim.

    Per slot (all DAGs together): created_at - slot (the firing transaction's clock), the
    scheduler's "runs created" log line - created_at (about the transaction's length; host
    clock, same machine as the database), first and last claim - slot.
    """
    slots: dict[datetime, Rows] = {}
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


def _probe(path: Path, measured: dict[str, Any]) -> dict[str, Any]:
    created: dict[datetime, datetime] = {}
    for r in measured["rows"]:
        created[r[1]] = max(created.get(r[1], r[2]), r[2])
    expected = seconds_from(measured["start"], measured["end"])
    late = sorted(
        {t for t, c in created.items() if (c - t).total_seconds() > 0.1}
        | {t for t in expected if t not in created}
    )
    return probe_summary(path, since=measured["start"], until=measured["end"], late=late)


def _figures(
    ids: list[str],
    options: SchedulesOptions,
    measured: dict[str, Any],
    sync_s: float,
    began: float,
    sqlite: bool,
) -> dict[str, Any]:
    rows = measured["rows"]
    start_delay = [(r[3] - r[1]).total_seconds() for r in rows if r[3] is not None]
    fire_delay = [(r[2] - r[1]).total_seconds() for r in rows]
    not_started = sum(1 for r in rows if r[3] is None)
    expected = seconds_from(measured["start"], measured["end"])
    audit = slot_audit([(r[0], r[1]) for r in rows], ids, expected)
    start = dist_ms(start_delay)
    p99 = start.get("p99_ms", math.inf)
    errors = measured["step_errors"]
    return {
        "settings": {
            "dags": options.dags,
            "schedule": "every 1 s (interval, catchup off)",
            "window_s": options.seconds,
            "skipped_after_unpause_s": options.skip_s,
            "processes": "treadle standalone" if sqlite else f"1 scheduler, {options.workers} worker(s)",
            "slots_per_worker": options.slots,
        },
        "load_1m_before_after": measured["load_1m_before_after"],
        "sync_wall_s": round(sync_s, 2),
        "unpaused_at_db": measured["unpaused_at"].astimezone(UTC).isoformat(),
        "window_db": [measured["start"].isoformat(), measured["end"].isoformat()],
        "first_pass_after_unpause": measured["first_pass"],
        "runs_in_window": len(rows),
        "fire_delay": dist_ms(fire_delay),
        "start_delay": start,
        "not_started": not_started,
        "scheduler_step_errors": errors,
        "per_slot": per_slot(rows, measured["fired"]),
        "slots": {**audit, "passed_over_logged_in_window": measured["passed_over"]},
        "cpu_in_window": measured["cpu"],
        **({"scheduler_probe": measured["scheduler_probe"]} if "scheduler_probe" in measured else {}),
        "wall_s": round(time.monotonic() - began, 1),
        "target": {"start_delay_p99_ms_below": 100, "missed": 0, "duplicated": 0},
        "meets_target": {
            "start_delay_p99": p99 < 100 and not_started == 0 and errors == 0,
            "every_slot_once": audit["missed"] == 0 and audit["duplicated"] == 0,
        },
    }
