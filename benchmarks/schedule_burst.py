"""Schedule burst: many DAGs due in the same second, one scheduler, no workers (PostgreSQL).

`--dags` DAGs of one no-op task each, all on `* * * * *` (or `--kind interval`: every 60 s,
which also fires on whole minutes), written `--per-file` to a file by a loop. The scheduler is
started first and leads, idle; then `treadle dags sync` registers the DAGs (timed: the sync
wall time is reported). It is started early enough in a minute (just after the boundary if
need be) for the schedules' first fire, the next whole minute after the sync transaction
began, to lie after the commit; should the commit come later than a second before it, the
minute after is measured instead (and reported as such). No worker runs: only run creation is measured.

Figures, for the runs of the measured slot (database clock):

* fire-to-queued delay: each root task instance's `queued_at` (the firing transaction's
  clock) - the slot (`data_interval_end`); count, p50, p99, max (target: p99 < 2 s and one run
  per DAG);
* when each batch committed: the scheduler logs "runs created" after each firing transaction
  (host clock, same machine); the last one is when every run was visible to workers.

`--probe` times the scheduler loop's phases per call (see SCHEDULER_PROBE in _common.py);
`--profile` also runs each `fire()` under cProfile inside the scheduler process and reports the
functions that took the time (profiling slows firing down: those delay figures are inflated).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pstats
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    Processes,
    check_alive,
    cli,
    code_drift,
    code_state,
    count_in_logs,
    db_clock,
    dist_ms,
    emit,
    log_mentions,
    machine,
    pg_database,
    print_log_tails,
    start_probed_scheduler,
    treadle_env,
    wait_for,
    write_scheduled_dags,
)

from treadle.scheduler.loop import FIRE_BATCH

PREFIX = "bench_burst"
#: Rough sync cost per DAG (seconds), to decide whether the sync fits in what is left of a minute.
SYNC_S_PER_DAG_GUESS = 0.006
SCHEDULES = {"cron": '"* * * * *"', "interval": "timedelta(seconds=60)"}


def wait_until_db(conn: psycopg.Connection[Any], until: datetime, check: Any) -> None:
    """Sleep until the database clock passes `until`, calling `check()` now and then."""
    while (left := (until - db_clock(conn)).total_seconds()) > 0:
        check()
        time.sleep(min(left, 0.5))


def fired_batches(path: Path, slot: datetime) -> list[dict[str, Any]]:
    """The scheduler's "runs created" lines from the slot on: seconds after it, runs."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if '"scheduler.fired"' in line:
            entry = json.loads(line)
            at = datetime.fromisoformat(entry["ts"])
            if at >= slot:
                found.append({"after_slot_s": round((at - slot).total_seconds(), 3), "runs": entry["runs"]})
    return found


def probe_batches(path: Path, slot: datetime) -> list[dict[str, Any]]:
    """Each fire_due_schedules call that created runs, from the probe: start and length."""
    found = []
    if not path.exists():
        return found
    for line in path.read_text(errors="replace").splitlines():
        entry = json.loads(line)
        if entry["phase"] == "fire_due_schedules" and entry.get("runs"):
            found.append(
                {
                    "started_after_slot_s": round(entry["start"] - slot.timestamp(), 3),
                    "took_s": round(entry["s"], 3),
                    "runs": entry["runs"],
                }
            )
    return found


def profile_top(prefix: Path, since: datetime, limit: int = 25) -> dict[str, Any]:
    """The functions that took the time in the profiled fire() calls from `since` on."""
    files = [
        p
        for p in prefix.parent.glob(prefix.name + ".*")
        if int(p.suffix[1:]) >= since.timestamp() * 1000 - 500
    ]
    if not files:
        return {"error": "no profile written"}
    stats = pstats.Stats(*(str(p) for p in files))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = max((v[3] for v in raw.values()), default=0.0)

    def name(key: tuple[str, int, str]) -> str:
        file, line, func = key
        for marker in ("/src/treadle/", "/site-packages/", "/lib/python3"):
            if marker in file:
                file = file.split(marker, 1)[1]
                break
        return f"{file}:{line}({func})"

    def rows(index: int) -> list[dict[str, Any]]:
        ordered = sorted(raw.items(), key=lambda kv: kv[1][index], reverse=True)[:limit]
        return [
            {"function": name(k), "calls": v[1], "own_s": round(v[2], 3), "cumulative_s": round(v[3], 3)}
            for k, v in ordered
        ]

    return {
        "fire_calls": len(files),
        "profiled_fire_s": round(total, 3),
        "by_cumulative": rows(3),
        "by_own_time": rows(2),
    }


def register(
    conn: psycopg.Connection[Any], env: dict[str, str], dags: int, timeout: float, alive: Any
) -> dict[str, Any]:
    """Sync the DAG folder early enough in a minute; returns the slot to measure and the sync time."""
    now = db_clock(conn)
    guess_s = 5 + dags * SYNC_S_PER_DAG_GUESS
    if now.second + now.microsecond / 1e6 + guess_s > 59:
        # Too little of this minute left for the sync: start it just after the boundary.
        wait_until_db(conn, now.replace(second=0, microsecond=0) + timedelta(minutes=1), alive)
    began = time.monotonic()
    cli(["dags", "sync"], env, timeout=timeout)
    sync_s = time.monotonic() - began
    synced_at = db_clock(conn)
    row = conn.execute("SELECT min(coalesce(last_fire_at, next_fire_at)) FROM schedules").fetchone()
    assert row is not None and row[0] is not None, "no schedule registered"
    first: datetime = row[0]  # the first fire after registration (a whole minute)
    margin = (first - synced_at).total_seconds()
    slot, measured = first, "first fire after registration (version cache cold)"
    if margin < 1:
        # Committed too close to (or after) the first fire: measure the next whole minute.
        slot = first + timedelta(minutes=math.ceil((1 - margin) / 60))
        measured = "a later fire: the sync committed too close to (or after) the first one"
    return {"slot": slot, "measured": measured, "sync_s": sync_s, "margin_s": margin}


def collect(
    conn: psycopg.Connection[Any], slot: datetime, dags: int, timeout: float, alive: Any
) -> tuple[list[tuple[Any, ...]], tuple[int, int]]:
    """Wait for the slot's runs (all of them, or until the timeout); returns root instances, counts."""
    wait_until_db(conn, slot, alive)
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute("SELECT count(*) FROM dag_runs WHERE data_interval_end = %s", (slot,)).fetchone()
        assert row is not None
        if row[0] >= dags or time.monotonic() > deadline:
            break
        alive()
        time.sleep(0.1)
    rows = conn.execute(
        "SELECT r.dag_id, t.queued_at, r.created_at FROM dag_runs r "
        "JOIN task_instances t ON t.run_id = r.run_id AND t.upstream_total = 0 "
        "WHERE r.data_interval_end = %s",
        (slot,),
    ).fetchall()
    runs = conn.execute(
        "SELECT count(*), count(DISTINCT dag_id) FROM dag_runs WHERE data_interval_end = %s", (slot,)
    ).fetchone()
    assert runs is not None
    return rows, (int(runs[0]), int(runs[1]))


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dags", type=int, default=10_000, help="DAGs, all due in the same second")
    parser.add_argument("--kind", choices=sorted(SCHEDULES), default="cron", help="cron * * * * * or 60 s")
    parser.add_argument("--per-file", type=int, default=1000, help="DAGs per generated file")
    parser.add_argument("--probe", action="store_true", help="time the scheduler loop's phases")
    parser.add_argument("--profile", action="store_true", help="cProfile fire() in the scheduler")
    parser.add_argument("--keep-logs", type=Path, help="copy the scheduler log (and probe) here")
    parser.add_argument("--timeout", type=float, default=170, help="seconds for sync and for the firing")
    args = parser.parse_args()

    procs = Processes()
    code_at_start = code_state()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_burst") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        write_scheduled_dags(
            folder, prefix=PREFIX, count=args.dags, schedule=SCHEDULES[args.kind], per_file=args.per_file
        )
        extra_env = {"TREADLE_BENCH_CPROFILE": str(root / "fire.prof")} if args.profile else {}
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home", **extra_env)
        log = root / "scheduler.log"
        probe = root / "probe.jsonl"
        try:
            cli(["db", "upgrade"], env)
            if args.probe or args.profile:
                start_probed_scheduler(procs, env, log, probe)
            else:
                procs.start(["scheduler"], env, log)
            wait_for(
                "the scheduler to lead", lambda: log_mentions(log, '"scheduler.leader_acquired"'), timeout=60
            )
            with psycopg.connect(url, autocommit=True) as conn:

                def alive() -> None:
                    check_alive(procs, [log])

                reg = register(conn, env, args.dags, args.timeout, alive)
                slot = reg["slot"]
                rows, runs = collect(conn, slot, args.dags, args.timeout, alive)
            procs.stop_all()  # the profile is dumped per fire(); stopping also ends further firing
            batches = fired_batches(log, slot)
            errors = count_in_logs([log], '"scheduler.step_error"')
            extra: dict[str, Any] = {}
            if args.probe or args.profile:
                extra["fire_due_schedules_calls"] = probe_batches(probe, slot)
            if args.profile:
                extra["profile"] = profile_top(root / "fire.prof", slot)
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for path in (log, probe, *root.glob("fire.prof.*")):
                    if path.exists():
                        shutil.copy(path, args.keep_logs / path.name)
        except BaseException:
            print_log_tails([log])
            raise
        finally:
            procs.stop_all()

    delays = [(q - slot).total_seconds() for _, q, _ in rows if q is not None]
    figures = dist_ms(delays)
    p99_s = figures.get("p99_ms", math.inf) / 1000
    all_created = runs[0] == args.dags and runs[1] == args.dags
    committed = batches[-1]["after_slot_s"] if batches else None
    emit(
        {
            "benchmark": "schedule_burst",
            "backend": "postgresql",
            "settings": {
                "dags": args.dags,
                "schedule": SCHEDULES[args.kind].strip('"'),
                "files": math.ceil(args.dags / args.per_file),
                "workers": 0,
                "fire_batch": FIRE_BATCH,
                "probe": args.probe or args.profile,
                "profile": args.profile,
            },
            "code": code_drift(code_at_start),
            "machine": {**machine(), "loadavg_1m_end": round(os.getloadavg()[0], 2)},
            "sync": {
                "dags_sync_wall_s": round(reg["sync_s"], 2),
                "sync_committed_before_first_slot_s": round(reg["margin_s"], 3),
            },
            "slot": slot.astimezone(UTC).isoformat(),
            "measured": reg["measured"],
            "runs_created": runs[0],
            "dags_with_a_run": runs[1],
            "fire_to_queued_s": {
                k.replace("_ms", "_s"): (round(v / 1000, 3) if k.endswith("_ms") else v)
                for k, v in figures.items()
            },
            "batches_committed": {
                "count": len(batches),
                "runs_per_batch": sorted({b["runs"] for b in batches}),
                "first_after_slot_s": batches[0]["after_slot_s"] if batches else None,
                "last_after_slot_s": committed,
            },
            **extra,
            "scheduler_step_errors": errors,
            "wall_s": round(time.monotonic() - began, 1),
            "target": {"fire_to_queued_p99_s_below": 2, "runs_created": args.dags},
            "meets_target": {
                "fire_to_queued_p99": p99_s < 2 and all_created and errors == 0,
                "all_committed_within_2s": committed is not None and committed < 2 and all_created,
            },
        }
    )


if __name__ == "__main__":
    main()
