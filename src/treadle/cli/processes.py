"""Long-running processes: `treadle worker`, `treadle scheduler`, `treadle standalone`."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import click

from treadle.cli.main import Context, cli, pass_context
from treadle.errors import InvalidRequest
from treadle.observability.logging import configure_logging
from treadle.scheduler.loop import Scheduler
from treadle.worker.worker import Worker

log = logging.getLogger("treadle")


def _queues(raw: str) -> list[str]:
    queues = [q.strip() for q in raw.split(",") if q.strip()]
    if not queues:
        raise InvalidRequest("--queues needs at least one queue name")
    return queues


def _on_stop(stop: threading.Event) -> None:
    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@cli.command("worker")
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Attempts run at once (one child process each).",
)
@click.option("--queues", default="default", show_default=True, help="Comma-separated queues.")
@click.option("--log-level", default="INFO", show_default=True)
@pass_context
def worker_cmd(ctx: Context, concurrency: int, queues: str, log_level: str) -> None:
    """Claim and run task attempts."""
    configure_logging(log_level)
    worker = Worker(ctx.db, ctx.settings, concurrency=concurrency, queues=_queues(queues))
    _run_until_signal(worker=worker)


@cli.command("scheduler")
@click.option("--log-level", default="INFO", show_default=True)
@pass_context
def scheduler_cmd(ctx: Context, log_level: str) -> None:
    """Apply due retries, reap expired leases, close finished runs."""
    configure_logging(log_level)
    scheduler = Scheduler(ctx.db, tick_s=ctx.settings.scheduler_tick_s)
    _run_until_signal(scheduler=scheduler)


@cli.command("standalone")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256))
@click.option("--log-level", default="INFO", show_default=True)
@pass_context
def standalone_cmd(ctx: Context, concurrency: int, log_level: str) -> None:
    """Scheduler and worker in one process (migrates the database first)."""
    configure_logging(log_level)
    db = ctx.db_upgraded("treadle-standalone")
    ctx.settings.dags_folder.mkdir(parents=True, exist_ok=True)
    click.echo(f"treadle standalone: database {db.url}, DAGs from {ctx.settings.dags_folder}", err=True)
    _run_until_signal(
        worker=Worker(db, ctx.settings, concurrency=concurrency, queues=["default"]),
        scheduler=Scheduler(db, tick_s=ctx.settings.scheduler_tick_s),
    )


def _run_until_signal(*, worker: Worker | None = None, scheduler: Scheduler | None = None) -> None:
    stop = threading.Event()
    _on_stop(stop)
    threads = []
    if scheduler is not None:
        threads.append(threading.Thread(target=scheduler.run, name="treadle-scheduler", daemon=True))
    if worker is not None:
        worker.start()
        threads.append(threading.Thread(target=worker.run, name="treadle-claim", daemon=True))
    for t in threads:
        t.start()
    stop.wait()
    log.info("stopping", extra={"event": "process.stopping"})
    if scheduler is not None:
        scheduler.stop()
    if worker is not None:
        worker.stop()
    for t in threads:
        t.join(timeout=15)
