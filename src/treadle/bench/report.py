"""The tables `treadle bench` prints, as plain rows of text built from its JSON figures.

One section per kind of figure, present only when a workload of that kind was measured: run
wall times (and Celery's), ready-to-started latency, large runs, 1-second schedules, failover,
the schedule burst. The CLI draws each section as a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MISSING = "-"


@dataclass(frozen=True, slots=True)
class Section:
    """One table: a title, its column headings and its rows (all text)."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]


def seconds(value: float | None, digits: int = 3) -> str:
    """`1.234 s`, or `-` when there is no value."""
    return MISSING if value is None else f"{value:.{digits}f} s"


def millis(value: float | None) -> str:
    """`12.3 ms` (one decimal below 100 ms, none above), or `-`."""
    if value is None:
        return MISSING
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


def duration(value: float | None) -> str:
    """Seconds as `46 ms` below one second, `2.81 s` above; `-` without a value."""
    if value is None:
        return MISSING
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def durations(values: list[float | None]) -> str:
    """Several seconds in one unit: `5 / 31 / 88 ms` when all are below a second, else
    `0.42 / 1.20 / 1.30 s`; `-` when one is missing."""
    if any(v is None for v in values):
        return MISSING
    known = [v for v in values if v is not None]
    if all(v < 1 for v in known):
        return " / ".join(f"{v * 1000:.0f}" for v in known) + " ms"
    return " / ".join(f"{v:.2f}" for v in known) + " s"


def number(value: float | None, digits: int = 0) -> str:
    """A number with thousands separators, or `-`."""
    return MISSING if value is None else f"{value:,.{digits}f}"


def megabytes(value: float | None) -> str:
    """`190.5 MB`, or `-`."""
    return MISSING if value is None else f"{value:.1f} MB"


def sections(result: dict[str, Any]) -> list[Section]:
    """Every table the result has figures for, in a fixed order."""
    found = [
        _runs(result),
        _latency(result),
        _large_time(result),
        _large_cost(result),
        _schedules(result),
        _failover(result),
        _burst(result),
    ]
    return [s for s in found if s.rows]


def title(result: dict[str, Any]) -> str:
    """The heading of the run table: database and processes."""
    s = result["settings"]
    return f"treadle bench: {s['database']}, {s['workers']} worker(s) x {s['slots_per_worker']} slots"


def _runs(result: dict[str, Any]) -> Section:
    rows: list[tuple[str, ...]] = []
    celery = any("celery" in w for w in result["workloads"].values())
    for name, w in result["workloads"].items():
        if "tasks" not in w:
            continue
        t, c = w["treadle"], w.get("celery")
        wall = t.get("median_wall_s", t.get("wall_s"))
        row: tuple[str, ...] = (
            name,
            number(w["tasks"]),
            seconds(wall),
            millis(wall * 1000 / w["tasks"]),
            number(w["tasks"] / wall),
        )
        if celery:
            row += (
                seconds(c["median_wall_s"]) if c else MISSING,
                f"{w['treadle_over_celery']}" if c else MISSING,
            )
        rows.append(row)
    columns: tuple[str, ...] = ("workload", "tasks", "treadle median", "per task", "tasks/s")
    if celery:
        columns += ("Celery median", "ratio")
    return Section(title(result), columns, rows)


def _latency(result: dict[str, Any]) -> Section:
    rows: list[tuple[str, ...]] = []
    for name, w in result["workloads"].items():
        figures = w.get("treadle", {}).get("ready_to_started")
        if not figures:
            continue
        rows.append(
            (
                name,
                number(figures["count"]),
                *(millis(figures.get(k)) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")),
            )
        )
    columns = ("workload", "tasks", "p50", "p90", "p99", "max")
    return Section("ready to started (queued_at -> started_at, first attempts)", columns, rows)


def _large_runs(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, w["treadle"]) for name, w in result["workloads"].items() if "created_s" in w.get("treadle", {})
    ]


def _large_time(result: dict[str, Any]) -> Section:
    rows: list[tuple[str, ...]] = []
    for name, t in _large_runs(result):
        compared = t.get("compared_with")
        rows.append(
            (
                name,
                seconds(t["wall_s"], 1)
                if t.get("finished", True)
                else f"unfinished after {t['wall_s']:.0f} s ({number(t['tasks_done'])} done)",
                seconds(t["created_s"], 1),
                number(t.get("executing_tasks_per_s")),
                _ratio(t.get("second_half_over_first_half")),
                _ratio(compared.get("executing_tasks_per_s_ratio")) if compared else MISSING,
            )
        )
    columns = ("run", "trigger to success", "creation", "tasks/s running", "2nd half / 1st", "vs first run")
    return Section("large runs: time (rates while tasks ran, by the database clock)", columns, rows)


def _large_cost(result: dict[str, Any]) -> Section:
    rows: list[tuple[str, ...]] = []
    for name, t in _large_runs(result):
        standalone = "standalone_cpu_s" in t
        rows.append(
            (
                name,
                seconds(t.get("standalone_cpu_s" if standalone else "scheduler_cpu_s"), 2)
                + (" (standalone)" if standalone else ""),
                millis(t.get("treadle_cpu_ms_per_task")),
                *(megabytes(t.get(k)) for k in ("peak_rss_mb", "peak_pss_mb", "peak_uss_mb")),
            )
        )
    columns = ("run", "scheduler CPU", "treadle CPU/task", "peak RSS", "peak PSS", "peak USS")
    return Section("large runs: cost (every treadle process and its children)", columns, rows)


def _ratio(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}"


def _dist(figures: dict[str, Any]) -> str:
    """p50 / p99 / max of a distribution in ms, or `-` without values."""
    if not figures.get("count"):
        return MISSING
    return durations([figures[k] / 1000 for k in ("p50_ms", "p99_ms", "max_ms")])


def _schedules(result: dict[str, Any]) -> Section:
    rows: list[tuple[str, ...]] = []
    for name, w in result["workloads"].items():
        t = w.get("treadle", {})
        if "fire_delay" not in t:
            continue
        slots = t["slots"]
        rows.append(
            (
                name,
                number(t["runs_in_window"]),
                _dist(t["fire_delay"]),
                _dist(t["start_delay"]),
                f"{slots['missed']} / {slots['duplicated']}",
            )
        )
    columns = (
        "workload",
        "runs",
        "fire delay p50/p99/max",
        "start delay p50/p99/max",
        "missed/doubled",
    )
    return Section("1-second schedules", columns, rows)


def _failover(result: dict[str, Any]) -> Section:
    rows: list[tuple[str, ...]] = []
    for name, w in result["workloads"].items():
        t = w.get("treadle", {})
        if "takeover_s" not in t:
            continue
        takeover, slots = t["takeover_s"], t["slots"]
        rows.append(
            (
                name,
                number(len(t["rounds"])),
                durations([takeover["p50"], takeover["max"]]),
                duration(takeover["lease_taken_max"]),
                f"{slots['missed']} / {slots['duplicated']}",
            )
        )
    columns = ("workload", "kills", "first run after kill p50/max", "lease taken max", "missed/doubled")
    return Section("leader failover (SIGKILL)", columns, rows)


def _burst(result: dict[str, Any]) -> Section:
    rows: list[tuple[str, ...]] = []
    for name, w in result["workloads"].items():
        t = w.get("treadle", {})
        if "fire_to_queued_s" not in t:
            continue
        delay = t["fire_to_queued_s"]
        rows.append(
            (
                name,
                f"{number(t['runs_created'])} of {number(t['settings']['dags'])}",
                duration(t["all_have_a_run_after_s"]),
                durations([delay.get(k) for k in ("p50_s", "p99_s", "max_s")]),
                duration(t["sync"]["dags_sync_wall_s"]),
            )
        )
    columns = ("workload", "runs", "all have a run after", "fire to queued p50/p99/max", "DAG sync")
    return Section("schedule burst (all due at once)", columns, rows)
