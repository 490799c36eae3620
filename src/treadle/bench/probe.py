"""Timing the scheduler loop from inside a `treadle scheduler` process, without changing it.

`start_probed_scheduler` runs the same command under SCHEDULER_PROBE, which wraps the loop's
phases so that each call appends one JSON line (phase, start, duration) to a file;
`probe_summary` turns those lines into per-phase durations and, for slots that fired late, what
the loop was busy with at the slot's instant.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from treadle.bench.harness import Processes, dist_ms

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


def probe_events(path: Path) -> list[dict[str, Any]]:
    """The lines the probe wrote (none if it wrote nothing)."""
    events: list[dict[str, Any]] = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def probe_summary(path: Path, *, since: datetime, until: datetime, late: list[datetime]) -> dict[str, Any]:
    """Durations per scheduler phase between two times, and what ran at each `late` moment.

    `late` holds slot times whose firing transaction started late: for each, the phases that
    were in progress at that instant (the reason the loop was not free to fire).
    """
    events = probe_events(path)
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
