"""`treadle bench`: measure treadle end to end on this machine and database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from treadle.cli.main import cli
from treadle.errors import InvalidRequest


@cli.command("bench")
@click.option(
    "--database",
    default="sqlite",
    show_default=True,
    help="'sqlite' (a fresh file) or a PostgreSQL URL whose user may create databases: a fresh "
    "database is made there and dropped afterwards.",
)
@click.option("--only", multiple=True, help="Workload to run (chain, fanout, independent, run); repeatable.")
@click.option("--slots", type=click.IntRange(1, 256), default=2, show_default=True, help="Slots per worker.")
@click.option("--workers", type=click.IntRange(1, 16), default=1, show_default=True, help="Worker processes.")
@click.option(
    "--reps", type=click.IntRange(1, 50), default=3, show_default=True, help="Measured repetitions."
)
@click.option(
    "--vs-celery", is_flag=True, help="Run the same shapes on Celery + Redis (needs treadle[bench])."
)
@click.option(
    "--redis", default="redis://127.0.0.1:6379/13", show_default=True, help="An empty Redis database."
)
@click.option(
    "--big",
    type=click.IntRange(100, 1_000_000),
    default=10_000,
    show_default=True,
    help="Tasks in the one large run.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the figures here.",
)
def bench(
    database: str,
    only: tuple[str, ...],
    slots: int,
    workers: int,
    reps: int,
    vs_celery: bool,
    redis: str,
    big: int,
    json_path: Path | None,
) -> None:
    """Run chain-100, fan-out 1 -> 500 -> 1, 2,000 independent tasks and one large run, each from
    trigger to seen success, on fresh real processes; print a table (and JSON)."""
    from treadle.bench.runner import BenchOptions, run_bench

    console = Console(stderr=True)
    options = BenchOptions(
        database=database,
        slots=slots,
        workers=workers,
        reps=reps,
        only=only,
        vs_celery=vs_celery,
        redis=redis,
        big=big,
        progress=lambda what: console.log(what),
    )
    try:
        result = run_bench(options)
    except (ValueError, RuntimeError) as exc:
        raise InvalidRequest(str(exc)) from exc
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2))
    Console().print(_table(result))


def _table(result: dict[str, Any]) -> Table:
    s = result["settings"]
    title = f"treadle bench: {s['database']}, {s['workers']} worker(s) x {s['slots_per_worker']} slots"
    table = Table(title=title)
    for column in ("workload", "tasks", "treadle median", "per task", "tasks/s", "Celery median", "ratio"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for name, w in result["workloads"].items():
        t = w["treadle"]
        c = w.get("celery")
        wall = t.get("median_wall_s", t.get("wall_s"))
        extra = (
            f" (scheduler CPU {t['scheduler_cpu_s']} s, peak {t['peak_pss_mb']} MB)"
            if "peak_pss_mb" in t
            else ""
        )
        table.add_row(
            name,
            str(w["tasks"]),
            f"{wall:.3f} s{extra}",
            f"{wall * 1000 / w['tasks']:.2f} ms",
            f"{w['tasks'] / wall:.0f}",
            f"{c['median_wall_s']:.3f} s" if c else "-",
            f"{w['treadle_over_celery']}" if c else "-",
        )
    return table
