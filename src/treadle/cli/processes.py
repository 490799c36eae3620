"""Long-running processes: `treadle worker`, `treadle scheduler`, `treadle standalone`."""

from __future__ import annotations

import functools
import logging
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING

import click

from treadle.authoring.artifacts import delete_run_files
from treadle.cli.main import Context, cli, pass_context
from treadle.errors import ConfigError, InvalidRequest
from treadle.observability.hooks import NO_HOOKS
from treadle.observability.logging import configure_logging
from treadle.scheduler.loop import Scheduler
from treadle.store.database import Database, normalise_url
from treadle.worker.child_process import prestart
from treadle.worker.worker import Worker

if TYPE_CHECKING:
    from treadle.cli.api import ApiInThread
    from treadle.delivery.relay import OutboxRelay
    from treadle.observability.metrics import Metrics
    from treadle.observability.server import ProcessServer

log = logging.getLogger("treadle")


def _queues(raw: str) -> list[str]:
    queues = [q.strip() for q in raw.split(",") if q.strip()]
    if not queues:
        raise InvalidRequest("--queues needs at least one queue name")
    return queues


def default_prefetch(concurrency: int) -> int:
    """The most attempts claimed ahead by default: two per slot, at least 16 and at most 64.

    Without --prefetch the buffer adapts below this ceiling (`worker.BufferSizer`): it holds
    what the slots finish while the next dispatch passes run, so a slot that frees has its next
    short task at hand, one round trip refills the buffer for several slots, and long tasks are
    not held back from idle workers. Admission stays bounded (slots plus this many)."""
    return min(max(2 * concurrency, 16), 64)


class Signals:
    """SIGTERM/SIGINT once: stop gracefully; twice: stop at once."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.hard = threading.Event()
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        (self.hard if self.stop.is_set() else self.stop).set()


_POLL_OPTION = click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.01, max=3600),
    default=1.0,
    show_default=True,
    help="Longest wait (seconds) before looking for work again when no wake-up came: wake-ups "
    "(NOTIFY on PostgreSQL, datagram sockets on SQLite) start ready work sooner; MariaDB has none.",
)


@cli.command("worker")
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Attempts run at once (one child process each).",
)
@click.option(
    "--prefetch",
    default=None,
    type=click.IntRange(0, 256),
    help="Attempts claimed ahead of a free slot (they wait, holding a lease, and a slot that frees "
    "takes one at once) [default: what the slots finish during the next two dispatch passes, "
    "at most twice the slots, at least 16, at most 64].",
)
@click.option("--queues", default="default", show_default=True, help="Comma-separated queues.")
@click.option(
    "--grace-period",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds running attempts get to finish on SIGTERM [TREADLE_SHUTDOWN_GRACE_SECONDS].",
)
@_POLL_OPTION
@click.option("--log-level", default="INFO", show_default=True)
@pass_context
def worker_cmd(
    ctx: Context,
    concurrency: int,
    prefetch: int | None,
    queues: str,
    grace_period: float | None,
    poll_interval: float,
    log_level: str,
) -> None:
    """Claim and run task attempts. SIGTERM drains (a second signal stops at once)."""
    settings = ctx.settings
    # A URL that cannot be opened (a missing driver, say) is refused before the fork server starts.
    normalise_url(settings.database_url)
    # The task processes' fork server starts while the worker sets itself up (Worker.start).
    prestart(settings.dags_folder, settings.max_result_bytes, settings.dag_import_timeout_s)
    fields = configure_logging(log_level, log_format=ctx.settings.log_format)
    adaptive = prefetch is None
    if prefetch is None:
        prefetch = default_prefetch(concurrency)
    metrics = _metrics(ctx)
    worker = Worker(
        ctx.db,
        ctx.settings,
        concurrency=concurrency,
        queues=_queues(queues),
        prefetch=prefetch,
        adaptive_prefetch=adaptive,
        poll_s=poll_interval,
        hooks=metrics or NO_HOOKS,
    )
    fields.bind(worker_id=worker.worker_id)
    server = _instrument(ctx, ctx.db, metrics, worker=worker)
    _run_until_signal(ctx, worker=worker, grace_s=grace_period, server=server)


@cli.command("scheduler")
@click.option("--log-level", default="INFO", show_default=True)
@pass_context
def scheduler_cmd(ctx: Context, log_level: str) -> None:
    """Fire schedules, apply due retries, reap expired leases, close finished runs.

    Run several for high availability: one leads (a lease on the database clock), the others
    stand by and take over within TREADLE_SCHEDULER_LEASE_SECONDS of the leader's death.
    """
    configure_logging(log_level, log_format=ctx.settings.log_format)
    metrics = _metrics(ctx)
    scheduler = _scheduler(ctx, ctx.db, metrics)
    server = _instrument(ctx, ctx.db, metrics, scheduler=scheduler)
    _run_until_signal(ctx, scheduler=scheduler, server=server, relay=_relay(ctx, ctx.db, scheduler))


@cli.command("standalone")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256))
@_POLL_OPTION
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--api-port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="REST API port."
)
@click.option("--api-host", default="127.0.0.1", show_default=True, help="REST API address.")
@click.option("--no-api", is_flag=True, help="Do not serve the REST API.")
@pass_context
def standalone_cmd(
    ctx: Context,
    concurrency: int,
    poll_interval: float,
    log_level: str,
    api_port: int,
    api_host: str,
    no_api: bool,
) -> None:
    """Scheduler, worker and REST API in one process (migrates the database first). SIGTERM drains."""
    fields = configure_logging(log_level, log_format=ctx.settings.log_format)
    db = ctx.db_upgraded("treadle-standalone")
    ctx.settings.dags_folder.mkdir(parents=True, exist_ok=True)
    click.echo(f"treadle standalone: database {db.url}, DAGs from {ctx.settings.dags_folder}", err=True)
    # Metrics are on by default here: on the API's /metrics, and on the metrics port if one is set.
    metrics = _metrics(ctx, always=not no_api)
    api = None if no_api else _start_api(ctx, host=api_host, port=api_port, metrics=metrics)
    worker = Worker(
        db,
        ctx.settings,
        concurrency=concurrency,
        queues=["default"],
        prefetch=default_prefetch(concurrency),
        adaptive_prefetch=True,
        poll_s=poll_interval,
        hooks=metrics or NO_HOOKS,
    )
    fields.bind(worker_id=worker.worker_id)
    scheduler = _scheduler(ctx, db, metrics)
    server = _instrument(
        ctx, db, metrics, worker=worker, scheduler=scheduler, api_serves_gauges=api is not None
    )
    _run_until_signal(
        ctx, worker=worker, scheduler=scheduler, server=server, relay=_relay(ctx, db, scheduler)
    )
    if api is not None:
        api.stop()


def _start_api(ctx: Context, *, host: str, port: int, metrics: Metrics | None) -> ApiInThread | None:
    """Serve the REST API beside the scheduler and worker; None, said once, when it may not.

    A refused API (an unsafe setting, a busy port) never stops the scheduler and worker.
    """
    from treadle.cli.api import ApiInThread, build_app

    try:
        api = ApiInThread(build_app(ctx, host=host, metrics=metrics), host=host, port=port)
    except ConfigError as exc:
        click.echo(f"treadle standalone: REST API not started: {exc}", err=True)
        return None
    api.start()
    click.echo(f"treadle standalone: web UI on http://{host}:{port}/ (REST API under /api/v1)", err=True)
    return api


def _metrics(ctx: Context, *, always: bool = False) -> Metrics | None:
    """The process's metrics: only where something serves them (prometheus_client loads lazily)."""
    if not always and ctx.settings.metrics_port is None:
        return None
    from treadle.observability.metrics import Metrics

    return Metrics()


def _instrument(
    ctx: Context,
    db: Database,
    metrics: Metrics | None,
    *,
    worker: Worker | None = None,
    scheduler: Scheduler | None = None,
    api_serves_gauges: bool = False,
) -> ProcessServer | None:
    """Gauges, database timing and the metrics port (observability/process.py); None: no metrics."""
    if metrics is None:
        return None
    from treadle.observability.process import instrument

    return instrument(
        ctx.settings,
        db,
        metrics,
        worker=worker,
        scheduler=scheduler,
        database_gauges=not api_serves_gauges,
    )


def _relay(ctx: Context, db: Database, scheduler: Scheduler) -> OutboxRelay | None:
    """The outbox relay of a scheduler, when a webhook, NATS, Slack or OpenLineage is configured
    (it delivers while leading)."""
    settings = ctx.settings
    from treadle.delivery.relay import OutboxRelay, Routes, Sink

    sinks: dict[str, Sink] = {}
    try:
        if settings.outbox_webhook_url is not None:
            from treadle.delivery.webhook import SINK, WebhookSink

            sinks[SINK] = WebhookSink(
                settings.outbox_webhook_url,
                secret=settings.outbox_webhook_secret,
                ack_s=settings.outbox_ack_s,
            )
        if settings.outbox_nats_url is not None:
            from treadle.delivery import nats

            sinks[nats.SINK] = nats.NatsSink(
                settings.outbox_nats_url,
                prefix=settings.outbox_nats_subject_prefix,
                jetstream=settings.outbox_nats_jetstream,
                ack_s=settings.outbox_ack_s,
            )
        if settings.alert_slack_url is not None:
            from treadle.delivery import slack

            sinks[slack.SINK] = slack.SlackSink(settings.alert_slack_url, ack_s=settings.outbox_ack_s)
        if settings.lineage_namespace is not None:
            from treadle.delivery import lineage

            sinks[lineage.SINK] = lineage.OpenLineageSink(
                url=settings.openlineage_url, file=settings.openlineage_file, ack_s=settings.outbox_ack_s
            )
    except ValueError as exc:  # a sink that cannot post where it is pointed (a URL, a proxy)
        raise ConfigError(str(exc)) from None
    if not sinks:
        return None
    from treadle.domain.outbox import DeliveryPolicy

    policy = DeliveryPolicy(max_attempts=settings.outbox_max_attempts)
    from treadle.engine.lineage import SINK as LINEAGE

    return OutboxRelay(
        db,
        scheduler.leadership,
        Routes(sinks),
        policy=policy,
        ack_s=settings.outbox_ack_s,
        ordered=lambda entry: entry.sink == LINEAGE,
    )


def _scheduler(ctx: Context, db: Database, metrics: Metrics | None = None) -> Scheduler:
    return Scheduler(
        db,
        tick_s=ctx.settings.scheduler_tick_s,
        retention_days=ctx.settings.retention_days,
        audit_retention_days=ctx.settings.audit_retention_days,
        on_pruned=functools.partial(
            delete_run_files, ctx.settings.home, artifacts_url=ctx.settings.artifacts_url
        ),
        lease_s=ctx.settings.lease_s,
        leader_lease_s=ctx.settings.scheduler_lease_s,
        default_queue_timeout_s=ctx.settings.queue_timeout_s,
        max_skew_s=ctx.settings.max_clock_skew_s,
        default_task_timeout_s=ctx.settings.default_task_timeout_s,
        admission=ctx.settings.admission_limits,
        hooks=metrics or NO_HOOKS,
    )


def _run_until_signal(
    ctx: Context,
    *,
    worker: Worker | None = None,
    scheduler: Scheduler | None = None,
    grace_s: float | None = None,
    server: ProcessServer | None = None,
    relay: OutboxRelay | None = None,
) -> None:
    signals = Signals()
    threads = []
    if scheduler is not None:
        threads.append(threading.Thread(target=scheduler.run, name="treadle-scheduler", daemon=True))
    if worker is not None:
        worker.start()
        threads.append(threading.Thread(target=worker.run, name="treadle-claim", daemon=True))
    for t in threads:
        t.start()
    if relay is not None:
        relay.start()
    signals.stop.wait()
    log.info("stopping", extra={"event": "process.stopping"})
    if worker is not None:
        grace = ctx.settings.shutdown_grace_s if grace_s is None else grace_s
        worker.stop(grace_s=grace, hard=signals.hard)
    if relay is not None:
        relay.stop()  # before the scheduler releases the lease its settles are fenced on
    if scheduler is not None:
        scheduler.stop()
    for t in threads:
        t.join(timeout=15)
    if server is not None:
        server.stop()
