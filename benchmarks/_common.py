"""Shared plumbing for the benchmark scripts.

The generic part (databases, processes, CPU meters, figures) lives in `treadle.bench.harness`,
which `treadle bench` uses too; what only the scheduler scripts need is below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from treadle.bench.harness import (
    PG_ADMIN_URL,
    CpuMeter,
    Processes,
    check_alive,
    cli,
    count_in_logs,
    cpu_seconds,
    emit,
    log_mentions,
    machine,
    percentile,
    pg_backend_pids,
    pg_database,
    pg_url,
    print_log_tails,
    stop_groups,
    summary_ms,
    treadle_env,
    wait_for,
)

__all__ = [
    "PG_ADMIN_URL",
    "CpuMeter",
    "Processes",
    "check_alive",
    "cli",
    "count_in_logs",
    "cpu_seconds",
    "emit",
    "log_mentions",
    "machine",
    "percentile",
    "pg_backend_pids",
    "pg_database",
    "pg_url",
    "print_log_tails",
    "stop_groups",
    "summary_ms",
    "treadle_env",
    "wait_for",
]


# --- Scheduled DAGs (schedule_latency.py, failover.py, schedule_burst.py) ---------------------


def write_scheduled_dags(
    folder: Path,
    *,
    prefix: str,
    count: int,
    schedule: str,
    per_file: int = 1000,
    catchup: bool = False,
) -> list[str]:
    """Write `count` DAGs of one no-op task each, `per_file` to a file (built in a loop).

    `schedule` is the Python source of the `schedule=` argument, e.g. `timedelta(seconds=1)` or
    `"* * * * *"`. Returns the DAG ids, `{prefix}_{i:05d}`.
    """
    ids = [f"{prefix}_{i:05d}" for i in range(count)]
    for part, first in enumerate(range(0, count, per_file)):
        last = min(first + per_file, count)
        source = f"""\
from __future__ import annotations

from datetime import timedelta

from treadle import dag, task


@task
def noop() -> None:
    return None


def build(dag_id: str):
    @dag(dag_id=dag_id, schedule={schedule}, catchup={catchup!r})
    def flow() -> None:
        noop()

    return flow


for _i in range({first}, {last}):
    globals()[f"dag_{{_i}}"] = build(f"{prefix}_{{_i:05d}}")
"""
        (folder / f"{prefix}_{part:03d}.py").write_text(source)
    return ids


def set_paused_many(url: str, dag_ids: list[str], *, paused: bool) -> datetime:
    """Pause or unpause many DAGs in ONE transaction (store API, audited); returns its DB time."""
    from treadle.store import audit
    from treadle.store import dags as dag_store
    from treadle.store.database import Database, db_now

    db = Database(url, application_name="treadle-bench")

    def work(conn: Any) -> datetime:
        now = db_now(conn)
        for dag_id in dag_ids:
            if dag_store.set_paused(conn, dag_id, paused=paused, now=now):
                action = "dag.pause" if paused else "dag.unpause"
                audit.record(conn, at=now, actor="bench", action=action, target=dag_id)
        return now

    try:
        return db.transact(work)
    finally:
        db.dispose()


def db_clock(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock_timestamp() (one round trip)."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def scheduler_lease(conn: psycopg.Connection[Any]) -> tuple[str | None, int, datetime | None]:
    """(holder, epoch, expires_at) of the `scheduler` leader lease; (None, 0, None) if absent."""
    row = conn.execute("SELECT holder, epoch, expires_at FROM leases WHERE name = 'scheduler'").fetchone()
    if row is None:
        return None, 0, None
    return row[0], int(row[1]), row[2]


def holder_pid(holder: str | None) -> int | None:
    """The process id in a scheduler holder string `host:pid:rand` (None if unparseable)."""
    if not holder:
        return None
    parts = holder.rsplit(":", 2)
    try:
        return int(parts[-2])
    except (IndexError, ValueError):
        return None


def dist_ms(values_s: list[float]) -> dict[str, float | int]:
    """Count, p50 / p95 / p99, min and max of durations in seconds, as milliseconds."""
    if not values_s:
        return {"count": 0}
    return {
        "count": len(values_s),
        "p50_ms": round(percentile(values_s, 50) * 1000, 2),
        "p95_ms": round(percentile(values_s, 95) * 1000, 2),
        "p99_ms": round(percentile(values_s, 99) * 1000, 2),
        "min_ms": round(min(values_s) * 1000, 2),
        "max_ms": round(max(values_s) * 1000, 2),
    }


def slot_audit(
    slots: list[tuple[str, datetime]], dag_ids: list[str], expected: list[datetime], *, sample: int = 10
) -> dict[str, Any]:
    """Compare each DAG's slots (dag_id, data_interval_end) with the expected ones, exactly once.

    Slots outside `expected` are ignored (the caller selects a window). Returns how many are
    missing and how many are duplicated, with a few examples of each.
    """
    wanted = set(expected)
    seen: dict[tuple[str, datetime], int] = {}
    for dag_id, end in slots:
        if end in wanted:
            seen[(dag_id, end)] = seen.get((dag_id, end), 0) + 1
    missing = [(d, t) for d in dag_ids for t in expected if (d, t) not in seen]
    duplicated = [(k, n) for k, n in seen.items() if n > 1]
    return {
        "expected_slots": len(dag_ids) * len(expected),
        "missed": len(missing),
        "duplicated": sum(n - 1 for _, n in duplicated),
        "missed_examples": [f"{d}@{t.isoformat()}" for d, t in missing[:sample]],
        "duplicated_examples": [f"{d}@{t.isoformat()} x{n}" for (d, t), n in duplicated[:sample]],
    }


#: Runs `treadle scheduler` with its loop's phases timed: each call of the wrapped functions
#: appends one JSON line {"phase", "start" (host epoch seconds), "s", ...} to the file in argv[1].
#: The wrappers only read the clock and write a line; the scheduler code itself is unchanged.
#: With TREADLE_BENCH_CPROFILE=PATH in its environment it also runs every fire() under cProfile
#: and dumps the stats of each call that created runs to PATH.<start ms> (this slows firing).
SCHEDULER_PROBE = """
import cProfile, json, os, sys, time
from treadle.scheduler import loop

out = open(sys.argv[1], "a", buffering=1)


def timed(name, fn, method):
    def wrapper(*args, **kwargs):
        began = time.time()
        result = None
        try:
            result = fn(*args, **kwargs)
            return result
        finally:
            line = {"phase": name, "start": began, "s": time.time() - began}
            runs = getattr(result, "runs_created", None)
            if runs is not None:
                line["runs"] = runs
            if method and name == "step":
                line["wait_s"] = result
            out.write(json.dumps(line) + chr(10))
    return wrapper


profile_path = os.environ.get("TREADLE_BENCH_CPROFILE")
if profile_path:
    # cProfile sees only the thread that enables it: profile inside the scheduler thread's fire().
    unprofiled_fire = loop.Scheduler.fire

    def profiled_fire(self):
        profiler = cProfile.Profile()
        began = time.time()
        profiler.enable()
        result = None
        try:
            result = unprofiled_fire(self)
            return result
        finally:
            profiler.disable()
            if result is not None and result.runs_created:
                profiler.dump_stats(f"{profile_path}.{int(began * 1000)}")

    loop.Scheduler.fire = profiled_fire
for name in ("fire", "tick", "trigger_datasets", "drain_backfills", "step"):
    if hasattr(loop.Scheduler, name):
        setattr(loop.Scheduler, name, timed(name, getattr(loop.Scheduler, name), True))
loop.Leadership.refresh = timed("lease_refresh", loop.Leadership.refresh, True)
for name in (
    "fire_due_schedules", "next_wakeup", "promote_due_retries", "reap_expired_leases",
    "enforce_execution_deadlines", "expire_dispatch_deadlines", "finish_idle_runs", "drain_backfills",
    "trigger_dataset_runs",
):
    if hasattr(loop, name):
        setattr(loop, name, timed(name, getattr(loop, name), False))
sys.argv = ["treadle", "scheduler"]
from treadle.cli.main import main
main()
"""


def start_probed_scheduler(
    procs: Processes, env: dict[str, str], log_path: Path, probe_path: Path
) -> subprocess.Popen[bytes]:
    """Start `treadle scheduler` under SCHEDULER_PROBE (tracked by `procs`, stopped like the rest)."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", SCHEDULER_PROBE, str(probe_path)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    procs.procs.append(proc)
    return proc


def probe_summary(path: Path, *, since: datetime, until: datetime, late: list[datetime]) -> dict[str, Any]:
    """Durations per scheduler phase between two times, and what ran at each `late` moment.

    `late` holds slot times whose firing transaction started late: for each, the phases that
    were in progress at that instant (the reason the loop was not free to fire).
    """
    events = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    lo, hi = since.timestamp(), until.timestamp()
    inside = [e for e in events if lo <= e["start"] < hi]
    phases: dict[str, list[float]] = {}
    for e in inside:
        phases.setdefault(e["phase"], []).append(e["s"])
    busy = {}
    for moment in late:
        at = moment.timestamp()
        running = sorted(
            (e for e in events if e["start"] <= at < e["start"] + e["s"] and e["phase"] != "step"),
            key=lambda e: e["start"],
        )
        busy[moment.isoformat()] = [
            f"{e['phase']} started {round((e['start'] - at) * 1000)} ms, took {round(e['s'] * 1000)} ms"
            for e in running
        ] or ["idle (sleeping)"]
    return {
        "phases": {
            name: {**dist_ms(values), "total_s": round(sum(values), 2)}
            for name, values in sorted(phases.items())
        },
        "window_s": round(hi - lo, 1),
        "late_slots_busy_with": busy,
    }


def code_state() -> dict[str, Any]:
    """The commit measured and a fingerprint of uncommitted changes under src/ (figures move with both)."""
    import hashlib

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout

    diff = git("diff", "HEAD", "--", "src")
    changed = [line for line in git("status", "--porcelain", "--", "src").splitlines() if line.strip()]
    import treadle

    imported = Path(treadle.__file__).resolve().parent
    return {
        "treadle_imported_from": str(imported),
        # When False (PYTHONPATH points elsewhere) the fields below describe the checkout, not
        # the code measured.
        "imported_from_checkout": imported == root / "src" / "treadle",
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "src_uncommitted_files": len(changed),
        "src_diff_sha1": hashlib.sha1(diff.encode(), usedforsecurity=False).hexdigest()[:12]
        if diff
        else None,
    }


def local_tcp_ports(pid: int) -> set[int]:
    """Local ports of a process's TCP sockets (Linux /proc; empty elsewhere or once it is gone)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def pg_connected(conn: psycopg.Connection[Any], pid: int) -> bool:
    """True once process `pid` holds a session on the connection's database (matched by port)."""
    ports = local_tcp_ports(pid)
    if not ports:
        return False
    rows = conn.execute(
        "SELECT client_port FROM pg_stat_activity WHERE datname = current_database()"
    ).fetchall()
    return any(r[0] in ports for r in rows)


def code_drift(at_start: dict[str, Any]) -> dict[str, Any]:
    """code_state() at the start, and whether the checkout changed while the benchmark ran."""
    now = code_state()
    return {**at_start, "changed_during_run": now != at_start, **({"at_end": now} if now != at_start else {})}


def whole_second_after(t: datetime) -> datetime:
    """The first whole second at or after `t`."""
    floor = t.replace(microsecond=0)
    return floor if floor == t else floor + timedelta(seconds=1)


def wait_db_time(conn: psycopg.Connection[Any], until: datetime, procs: Processes, logs: list[Path]) -> None:
    """Sleep until the database clock passes `until`, checking the processes now and then."""
    while True:
        left = (until - db_clock(conn)).total_seconds()
        if left <= 0:
            return
        check_alive(procs, logs)
        time.sleep(min(left, 1.0))
