"""`treadle bench`: measure treadle end to end on this machine and database."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from types import FrameType

import click

from treadle.cli.main import cli
from treadle.cli.render import log_line, table
from treadle.errors import InvalidRequest


@cli.command("bench")
@click.option(
    "--database",
    default="sqlite",
    show_default=True,
    help="'sqlite' (a fresh file) or a PostgreSQL URL whose user may create databases: a fresh "
    "database is made there and dropped afterwards.",
)
@click.option(
    "--only",
    multiple=True,
    help="Workload to run, repeatable: chain, fanout, independent, run (the large run), huge "
    "(the 100,000-task run), schedules, failover, burst; full names (chain-100) work too.",
)
@click.option(
    "--all", "everything", is_flag=True, help="Every workload but the huge run (add --huge for it)."
)
@click.option("--huge", is_flag=True, help="Also one run of --huge-tasks tasks, compared with the large run.")
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
    "--huge-tasks",
    type=click.IntRange(100, 10_000_000),
    default=100_000,
    show_default=True,
    help="Tasks in the huge run.",
)
@click.option(
    "--schedules",
    type=click.IntRange(1, 10_000),
    default=100,
    show_default=True,
    help="DAGs on a 1-second schedule (schedules workload).",
)
@click.option(
    "--duration",
    type=click.IntRange(1, 3600),
    default=60,
    show_default=True,
    help="Seconds the schedules workload measures.",
)
@click.option(
    "--failovers",
    type=click.IntRange(1, 50),
    default=3,
    show_default=True,
    help="Times the failover workload kills the leader.",
)
@click.option(
    "--burst",
    type=click.IntRange(1, 100_000),
    default=10_000,
    show_default=True,
    help="DAGs due at once (burst workload).",
)
@click.option(
    "--burst-every",
    type=click.IntRange(2, 3600),
    default=None,
    help="Put the burst's DAGs on an interval of this many seconds instead of cron '* * * * *' "
    "(a short one makes a quick run).",
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
    everything: bool,
    huge: bool,
    slots: int,
    workers: int,
    reps: int,
    vs_celery: bool,
    redis: str,
    big: int,
    huge_tasks: int,
    schedules: int,
    duration: int,
    failovers: int,
    burst: int,
    burst_every: int | None,
    json_path: Path | None,
) -> None:
    """Measure treadle on fresh real processes and print tables (and JSON).

    By default: chain-100, fan-out 1 -> 500 -> 1 and 2,000 independent tasks (trigger to seen
    success, repeated), and one 10,000-task run (time, tasks/s, scheduler CPU, peak memory),
    each with its ready-to-started latency. --only schedules, failover or burst measure the
    scheduler; --huge adds a 100,000-task run; --all runs every workload but that one.
    """
    from treadle.bench.options import BenchOptions
    from treadle.bench.report import sections
    from treadle.bench.runner import run_bench

    options = BenchOptions(
        database=database,
        slots=slots,
        workers=workers,
        reps=reps,
        only=only,
        everything=everything,
        huge=huge,
        vs_celery=vs_celery,
        redis=redis,
        big=big,
        huge_tasks=huge_tasks,
        schedules=schedules,
        duration_s=duration,
        failovers=failovers,
        burst=burst,
        burst_every_s=burst_every,
        progress=log_line,
    )
    # SIGTERM unwinds like Ctrl-C, so every process the bench started is stopped and its
    # temporary database dropped.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = run_bench(options)
    except (ValueError, RuntimeError) as exc:
        raise InvalidRequest(str(exc)) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2))
    for section in sections(result):
        # The first column names what was measured; the figures are aligned to the right.
        table(section.title, section.columns, section.rows, right=range(1, len(section.columns)))
    if result["errors"]:
        failed = "; ".join(f"{name}: {error}" for name, error in result["errors"].items())
        raise click.ClickException(f"{len(result['errors'])} workload(s) failed: {failed}")


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt
