"""Schedule burst: many DAGs due in the same second, one scheduler, no worker (`--only burst`).

`dags` DAGs of one no-op task each, all on `* * * * *` (or, with `every_s`, on an interval of
that many seconds, which fires on its multiples since 1970: 60 also fires on whole minutes),
written `per_file` to a file by a loop. The scheduler is started first and leads, idle; then
`treadle dags sync` registers the DAGs (timed). A new schedule's first fire is the first slot
after the sync transaction began, so the sync is started early enough in a period (just after a
boundary if need be) for it to commit first; should it commit less than a second before that
slot, a later slot is measured (and reported as such). No worker runs: only run creation is
measured.

Figures, for the runs of the measured slot:

* how long until every DAG has a run: the scheduler logs "runs created" after each firing
  transaction commits (host clock, same machine); the last of them, minus the slot, is when
  every run was visible to workers (target < 2 s);
* fire-to-queued delay: each root task instance's `queued_at` (the firing transaction's clock,
  taken at its start) - the slot (`data_interval_end`): count, p50, p99, max;
* one run per DAG.

`probe` times the scheduler loop's phases per call (bench/probe.py); `profile` also runs each
`fire()` under cProfile inside the scheduler process and reports the functions that took the
time (profiling slows firing down: those delay figures are inflated).
"""

from __future__ import annotations

import math
import os
import pstats
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from treadle.bench.db import Rows
from treadle.bench.harness import cli, count_in_logs, dist_ms, migrate, wait_for
from treadle.bench.probe import probe_events
from treadle.bench.scheduling import QUIET, STARTUP_S, Cluster, fired_log, write_scheduled_dags
from treadle.scheduler.loop import FIRE_BATCH
from treadle.store.tables import dag_runs, schedules, task_instances

PREFIX = "bench_burst"
#: Rough sync cost per DAG (seconds), to decide whether the sync fits in what is left of a period.
SYNC_S_PER_DAG_GUESS = 0.006


@dataclass(frozen=True, slots=True, kw_only=True)
class BurstOptions:
    """How many DAGs fall due at once, and on what schedule."""

    dags: int = 10_000
    #: None: cron `* * * * *`; else an interval schedule of this many seconds.
    every_s: int | None = None
    per_file: int = 1000
    probe: bool = False
    profile: bool = False
    keep_logs: Path | None = None
    timeout_s: float = 170.0
    progress: Callable[[str], None] = QUIET

    @property
    def period_s(self) -> int:
        """Seconds between two slots."""
        return 60 if self.every_s is None else self.every_s

    @property
    def schedule(self) -> str:
        """The `schedule=` argument of the DAGs, as Python source."""
        return '"* * * * *"' if self.every_s is None else f"timedelta(seconds={self.every_s})"


def measure_burst(root: Path, url: str, options: BurstOptions) -> dict[str, Any]:
    """Register `dags` scheduled DAGs on a fresh database and time one slot's burst."""
    if options.dags < 1 or options.period_s < 2:
        raise ValueError("the burst needs at least one DAG and slots at least 2 seconds apart")
    began = time.monotonic()
    extra_env = {"TREADLE_BENCH_CPROFILE": str(root / "fire.prof")} if options.profile else {}
    cluster = Cluster(root, url, **extra_env)
    write_scheduled_dags(
        cluster.folder,
        prefix=PREFIX,
        count=options.dags,
        schedule=options.schedule,
        per_file=options.per_file,
    )
    probe = root / "probe.jsonl"
    try:
        migrate(cluster.url)
        cluster.start_scheduler("scheduler", probe=probe if options.probe or options.profile else None)
        cluster.wait_log(
            "scheduler", '"scheduler.leader_acquired"', "the scheduler to lead", timeout=STARTUP_S
        )
        options.progress(f"burst: registering {options.dags} scheduled DAGs")
        reg = register(cluster, options)
        slot = reg["slot"]
        options.progress(f"burst: waiting for the slot at {slot.isoformat()}")
        rows, runs = collect(cluster, slot, options)
        cluster.procs.stop_all()  # the profile is dumped per fire(); stopping ends further firing
        log = cluster.log("scheduler")
        batches = fired_batches(fired_log(log), slot, options.period_s)
        errors = count_in_logs([log], '"scheduler.step_error"')
        extra: dict[str, Any] = {}
        if options.probe or options.profile:
            extra["fire_due_schedules_calls"] = probe_batches(probe, slot)
        if options.profile:
            extra["profile"] = profile_top(root / "fire.prof", slot)
        if options.keep_logs:
            options.keep_logs.mkdir(parents=True, exist_ok=True)
            for path in (log, probe, *root.glob("fire.prof.*")):
                if path.exists():
                    shutil.copy(path, options.keep_logs / path.name)
    except BaseException:
        cluster.dump_logs()
        raise
    finally:
        cluster.stop()
    return _figures(options, reg, rows, runs, batches, errors, extra, began)


def register(cluster: Cluster, options: BurstOptions) -> dict[str, Any]:
    """Sync the DAG folder early enough in a period; returns the slot to measure and the sync time."""
    bdb, period = cluster.bdb, options.period_s
    now = bdb.now()
    guess_s = 5 + options.dags * SYNC_S_PER_DAG_GUESS
    into = now.timestamp() % period
    if guess_s < period - 1 and into + guess_s > period - 1:
        # Too little of this period left for the sync: start it just after the boundary.
        bdb.wait_until(now + timedelta(seconds=period - into), cluster.alive)
    began = time.monotonic()
    # 27-60 s for 10,000 DAGs on a shared 2-core machine, over 300 s under heavy load.
    cli(["dags", "sync"], cluster.env, timeout=max(options.timeout_s, 60 + 0.1 * options.dags))
    sync_s = time.monotonic() - began
    synced_at = bdb.now()
    first = bdb.scalar(
        sa.select(sa.func.min(sa.func.coalesce(schedules.c.last_fire_at, schedules.c.next_fire_at)))
    )
    if first is None:
        raise RuntimeError("no schedule was registered")
    margin = (first - synced_at).total_seconds()
    slot, measured = first, "first fire after registration (version cache cold)"
    if margin < 1:
        # Committed too close to (or after) the first fire: measure a later slot.
        slot = first + timedelta(seconds=period * math.ceil((1 - margin) / period))
        measured = "a later fire: the sync committed too close to (or after) the first one"
    return {"slot": slot, "measured": measured, "sync_s": sync_s, "margin_s": margin}


def collect(cluster: Cluster, slot: datetime, options: BurstOptions) -> tuple[Rows, tuple[int, int]]:
    """Wait for the slot's runs (all of them, or until the timeout); returns root instances, counts."""
    bdb = cluster.bdb
    bdb.wait_until(slot, cluster.alive)
    r, t = dag_runs, task_instances
    # A range, not equality: SQLite keeps times as text, written by more than one formatter.
    in_slot = sa.and_(r.c.data_interval_end >= slot, r.c.data_interval_end < slot + timedelta(seconds=1))
    counts = sa.select(sa.func.count(), sa.func.count(sa.distinct(r.c.dag_id))).where(in_slot)

    def all_created() -> bool:
        cluster.alive()
        return int(bdb.rows(counts)[0][0]) >= options.dags

    try:
        wait_for("every DAG's run", all_created, timeout=options.timeout_s)
    except TimeoutError:
        pass  # reported as runs_created below the DAG count
    rows = bdb.rows(
        sa.select(r.c.dag_id, t.c.queued_at, r.c.created_at)
        .select_from(r.join(t, sa.and_(t.c.run_id == r.c.run_id, t.c.upstream_total == 0)))
        .where(in_slot)
    )
    found = bdb.rows(counts)[0]
    return rows, (int(found[0]), int(found[1]))


def fired_batches(fired: list[tuple[datetime, int]], slot: datetime, period_s: int) -> list[dict[str, Any]]:
    """The scheduler's "runs created" lines within one period from the slot: seconds after it, runs."""
    return [
        {"after_slot_s": round((at - slot).total_seconds(), 3), "runs": runs}
        for at, runs in fired
        if slot <= at < slot + timedelta(seconds=period_s)
    ]


def probe_batches(path: Path, slot: datetime) -> list[dict[str, Any]]:
    """Each fire_due_schedules call that created runs, from the probe: start and length."""
    return [
        {
            "started_after_slot_s": round(e["start"] - slot.timestamp(), 3),
            "took_s": round(e["s"], 3),
            "runs": e["runs"],
        }
        for e in probe_events(path)
        if e["phase"] == "fire_due_schedules" and e.get("runs")
    ]


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


def _figures(
    options: BurstOptions,
    reg: dict[str, Any],
    rows: Rows,
    runs: tuple[int, int],
    batches: list[dict[str, Any]],
    errors: int,
    extra: dict[str, Any],
    began: float,
) -> dict[str, Any]:
    slot: datetime = reg["slot"]
    delays = [(queued - slot).total_seconds() for _, queued, _ in rows if queued is not None]
    figures = dist_ms(delays)
    p99_s = figures.get("p99_ms", math.inf) / 1000
    all_created = runs[0] == options.dags and runs[1] == options.dags
    committed = batches[-1]["after_slot_s"] if batches else None
    return {
        "settings": {
            "dags": options.dags,
            "schedule": options.schedule.strip('"'),
            "files": math.ceil(options.dags / options.per_file),
            "workers": 0,
            "fire_batch": FIRE_BATCH,
            "probe": options.probe or options.profile,
            "profile": options.profile,
        },
        "load_1m_end": round(os.getloadavg()[0], 2),
        "sync": {
            "dags_sync_wall_s": round(reg["sync_s"], 2),
            "sync_committed_before_first_slot_s": round(reg["margin_s"], 3),
        },
        "slot": slot.astimezone(UTC).isoformat(),
        "measured": reg["measured"],
        "runs_created": runs[0],
        "dags_with_a_run": runs[1],
        "all_have_a_run_after_s": committed if all_created else None,
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
        "target": {
            "all_have_a_run_within_s": 2,
            "fire_to_queued_p99_s_below": 2,
            "runs_created": options.dags,
        },
        "meets_target": {
            "fire_to_queued_p99": p99_s < 2 and all_created and errors == 0,
            "all_committed_within_2s": committed is not None and committed < 2 and all_created,
        },
    }
