"""`treadle bench`: end-to-end workloads on real treadle processes, optionally against Celery.

Run workloads (chain, fan-out, independent tasks, one large run and, with `--huge`, a 100,000-task
run) share one set of processes on a fresh database (treadle_side.py); the repeated ones are
interleaved with the same shapes on Celery when asked (celery_side.py), repetition by
repetition, so load on the machine falls on both alike. Each scheduler workload (1-second
schedules, leader failover, a burst of due schedules) gets a fresh database and processes of its
own (schedules.py, failover.py, burst.py).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treadle.bench.burst import BurstOptions, measure_burst
from treadle.bench.celery_side import CelerySide
from treadle.bench.failover import FailoverOptions, measure_failover
from treadle.bench.figures import ratio
from treadle.bench.harness import machine, pg_database, print_log_tails, server_settings
from treadle.bench.options import BenchOptions
from treadle.bench.schedules import SchedulesOptions, measure_schedules
from treadle.bench.treadle_side import TreadleSide
from treadle.bench.workloads import Workload, workloads
from treadle.domain.urls import parse_database_url
from treadle.store.database import normalise_url

__all__ = ["BenchOptions", "Choice", "run_bench", "selected"]

#: What `treadle bench` measures when neither --only nor --all says otherwise.
DEFAULT_WORKLOADS = ("chain", "fanout", "independent", "run")


@dataclass(frozen=True, slots=True)
class Choice:
    """One workload of the bench: its short name (for --only), its reported name, and for a
    run workload its DAG (None for the scheduler workloads)."""

    short: str
    name: str
    description: str
    workload: Workload | None = None


def catalogue(options: BenchOptions) -> list[Choice]:
    """Every workload, in the order they are measured."""
    runs = workloads(
        chain=options.chain,
        width=options.width,
        independent=options.independent,
        big=options.big,
        huge=options.huge_tasks,
    )
    every = [Choice(w.short, w.name, w.description, w) for w in runs]
    burst_on = "* * * * *" if options.burst_every_s is None else f"every {options.burst_every_s} s"
    every += [
        Choice(
            "schedules",
            f"schedules-{options.schedules}",
            f"{options.schedules} DAGs on a 1-second schedule for {options.duration_s} s: fire delay",
        ),
        Choice("failover", "failover", f"two schedulers, the leader SIGKILLed {options.failovers} time(s)"),
        Choice("burst", f"burst-{options.burst}", f"{options.burst} DAGs on {burst_on}, due at once"),
    ]
    return every


def selected(options: BenchOptions) -> list[Choice]:
    """The workloads `options` asks for, in bench order; ValueError naming an unknown one."""
    every = catalogue(options)
    by_name = {c.short: c for c in every} | {c.name: c for c in every}
    unknown = [n for n in options.only if n not in by_name]
    if unknown:
        names = ", ".join(c.short for c in every)
        raise ValueError(f"unknown workload {', '.join(unknown)}: choose from {names}")
    if options.only:
        wanted = {by_name[n].short for n in options.only}
    elif options.everything:
        wanted = {c.short for c in every if c.short != "huge"}
    else:
        wanted = set(DEFAULT_WORKLOADS)
    if options.huge:
        wanted.add("huge")
    chosen = [c for c in every if c.short in wanted]
    if len({c.name for c in chosen}) < len(chosen):
        raise ValueError("the large and the huge run have the same size: give --big and --huge-tasks apart")
    return chosen


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Measure the selected workloads; returns the figures (one entry per workload).

    A workload that fails (a process died, a wait timed out) is recorded under `errors` and the
    others are still measured, so one failure does not cost the figures of the rest.
    """
    chosen = selected(options)
    check_database(options.database)
    load_start = os.getloadavg()
    runs = [c.workload for c in chosen if c.workload is not None]
    figures: dict[str, Any] = {}
    errors: dict[str, str] = {}
    celery_version = None
    if runs:
        try:
            figures, errors, celery_version = _run_workloads(runs, options)
        except Exception as exc:
            errors |= {w.name: describe(exc) for w in runs}
            options.progress(f"the run workloads failed: {describe(exc)}")
    for choice in chosen:
        if choice.workload is None:
            options.progress(f"{choice.name}: starting")
            try:
                measured = _scheduler_workload(choice.short, options)
            except Exception as exc:
                errors[choice.name] = describe(exc)
                options.progress(f"{choice.name} failed: {describe(exc)}")
                continue
            figures[choice.name] = {"description": choice.description, "treadle": measured}
    return {
        "benchmark": "treadle bench",
        "settings": {
            "database": "sqlite" if options.database == "sqlite" else "postgresql",
            "workers": 1 if options.database == "sqlite" else options.workers,
            "slots_per_worker": options.slots,
            "reps": options.reps,
            "celery": celery_version,
            **({} if options.database == "sqlite" else {"server": server_settings(options.database)}),
        },
        "machine": machine()
        | {"load_average_start": list(load_start), "load_average_end": list(os.getloadavg())},
        "workloads": figures,
        "errors": errors,
    }


def describe(exc: BaseException) -> str:
    """An error as one line for the report: its class and message (first 2,000 characters)."""
    return f"{type(exc).__name__}: {exc}"[:2000]


def check_database(database: str) -> None:
    """ValueError unless `database` is "sqlite" or a PostgreSQL URL; ConfigError naming the
    extra when psycopg is not installed."""
    if database == "sqlite":
        return
    scheme = parse_database_url(database).scheme
    if not scheme.startswith("postgresql"):
        raise ValueError(f"treadle bench measures PostgreSQL or SQLite, not {scheme}")
    normalise_url(database)


def _run_workloads(
    chosen: list[Workload], options: BenchOptions
) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """The run workloads on one set of processes (and Celery's when asked): figures, errors of
    the large runs that could not be measured, and Celery's version."""
    repeated = [w for w in chosen if not w.once]
    errors: dict[str, str] = {}
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="treadle-bench-")))
        url = _database(stack, options, root)
        treadle = TreadleSide(root, url, options, chosen)
        stack.callback(treadle.stop)
        celery = CelerySide(root, options) if options.vs_celery else None
        if celery is not None:
            stack.callback(celery.stop)
        try:
            options.progress("starting treadle")
            treadle.start()
            if celery is not None:
                options.progress("starting Celery")
                celery.start()
            figures = _measure(treadle, celery, repeated, options)
        except BaseException:
            print_log_tails(treadle.logs + (celery.logs if celery else []))
            raise
        blocked = ""
        for w in (w for w in chosen if w.once):
            if blocked:
                errors[w.name] = blocked
                continue
            options.progress(f"{w.name}: treadle")
            try:
                measured = treadle.big(w)
            except Exception as exc:
                print_log_tails(treadle.logs)
                errors[w.name] = describe(exc)
                blocked = f"not measured: {w.name} failed first"
                continue
            figures[w.name] = {"treadle": measured, "tasks": w.tasks, "description": w.description}
            if not measured["finished"]:
                blocked = f"not measured: {w.name} was still running"
        version = celery.version() if celery else None
    _compare_large_runs(figures, chosen)
    return figures, errors, version


def _compare_large_runs(figures: dict[str, Any], chosen: list[Workload]) -> None:
    """Set, on each large run after the first, its rate and CPU per task against the first one's
    (1.0: cost per task did not grow with the run's size)."""
    large = [w for w in chosen if w.once and w.name in figures]
    if len(large) < 2:
        return
    base = figures[large[0].name]["treadle"]
    for w in large[1:]:
        mine = figures[w.name]["treadle"]
        mine["compared_with"] = {
            "workload": large[0].name,
            "executing_tasks_per_s_ratio": ratio(
                mine.get("executing_tasks_per_s"), base.get("executing_tasks_per_s")
            ),
            "tasks_per_s_ratio": ratio(mine.get("tasks_per_s"), base.get("tasks_per_s")),
            "treadle_cpu_ms_per_task_ratio": ratio(
                mine.get("treadle_cpu_ms_per_task"), base.get("treadle_cpu_ms_per_task")
            ),
        }


def _scheduler_workload(short: str, options: BenchOptions) -> dict[str, Any]:
    """One scheduler workload on a database and processes of its own."""
    measures: dict[str, Callable[[Path, str], dict[str, Any]]] = {
        "schedules": lambda root, url: measure_schedules(
            root,
            url,
            SchedulesOptions(
                dags=options.schedules,
                seconds=options.duration_s,
                workers=options.workers,
                slots=options.slots,
                progress=options.progress,
            ),
        ),
        "failover": lambda root, url: measure_failover(
            root,
            url,
            FailoverOptions(
                repeats=options.failovers, warmup_s=2.0, slots=options.slots, progress=options.progress
            ),
        ),
        "burst": lambda root, url: measure_burst(
            root,
            url,
            BurstOptions(
                dags=options.burst,
                every_s=options.burst_every_s,
                timeout_s=max(options.timeout_s, 170.0),
                progress=options.progress,
            ),
        ),
    }
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"treadle-bench-{short}-")))
        url = _database(stack, options, root)
        return measures[short](root, url)


def _database(stack: ExitStack, options: BenchOptions, root: Path) -> str:
    check_database(options.database)
    if options.database == "sqlite":
        return f"sqlite:///{root / 'bench.db'}"
    return stack.enter_context(pg_database("treadle_bench", options.database))


def _measure(
    treadle: TreadleSide, celery: CelerySide | None, chosen: list[Workload], options: BenchOptions
) -> dict[str, Any]:
    walls: dict[str, dict[str, list[float]]] = {w.name: {"treadle": [], "celery": []} for w in chosen}
    run_ids: dict[str, list[str]] = {w.name: [] for w in chosen}
    for w in chosen:  # one warm-up each (imports, caches, connections)
        treadle.once(w)
        if celery is not None and w.celery is not None:
            celery.once(w)
    for rep in range(options.reps):
        for w in chosen:
            options.progress(f"{w.name}: repetition {rep + 1} of {options.reps}")
            measured = treadle.once(w)
            walls[w.name]["treadle"].append(measured["wall_s"])
            run_ids[w.name].append(measured["run_id"])
            if celery is not None and w.celery is not None:
                walls[w.name]["celery"].append(celery.once(w)["wall_s"])
    figures: dict[str, Any] = {}
    for w in chosen:
        t = walls[w.name]["treadle"]
        entry: dict[str, Any] = {
            "tasks": w.tasks,
            "description": w.description,
            "treadle": _stats(t, w.tasks) | {"ready_to_started": treadle.latency(run_ids[w.name])},
        }
        c = walls[w.name]["celery"]
        if c:
            entry["celery"] = _stats(c, w.tasks)
            entry["treadle_over_celery"] = round(statistics.median(t) / statistics.median(c), 2)
        figures[w.name] = entry
    return figures


def _stats(walls: list[float], tasks: int) -> dict[str, Any]:
    median = statistics.median(walls)
    return {
        "median_wall_s": round(median, 4),
        "walls_s": [round(w, 4) for w in walls],
        "ms_per_task": round(median * 1000 / tasks, 3),
        "tasks_per_s": round(tasks / median, 1),
    }
