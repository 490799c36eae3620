"""Operational views: `treadle why`, `queues`, `workers`."""

from __future__ import annotations

import click

from treadle.cli.main import Context, cli, pass_context
from treadle.cli.render import emit_json, fmt_time, table
from treadle.domain.mapping import instance_label
from treadle.engine import diagnosis, queries


@cli.command("why")
@click.argument("run_id")
@click.argument("task_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def why_cmd(ctx: Context, run_id: str, task_id: str | None, as_json: bool) -> None:
    """Why is a task not running? The first condition holding each task instance, and who holds it."""
    found = diagnosis.why(ctx.db, run_id, task_id, worker_stale_s=ctx.settings.lease_s)
    if as_json:
        emit_json(found)
        return
    table(
        f"Why: {run_id}",
        ["task", "state", "reason", "held by"],
        [(instance_label(w.task_id, w.map_index), w.state, w.reason, "; ".join(w.held_by)) for w in found],
    )


@cli.command("queues")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def queues_cmd(ctx: Context, as_json: bool) -> None:
    """Queue depth, oldest queued age, and the live workers serving each queue."""
    found = queries.list_queues(ctx.db, worker_stale_s=ctx.settings.lease_s)
    if as_json:
        emit_json(found)
        return
    table(
        "Queues",
        ["queue", "queued", "running", "oldest queued", "workers"],
        [
            (
                q.queue,
                q.queued,
                q.running,
                "-" if q.oldest_queued_age_s is None else f"{q.oldest_queued_age_s:.1f} s ago",
                ", ".join(q.workers) or "none",
            )
            for q in found
        ],
    )


@cli.command("workers")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def workers_cmd(ctx: Context, as_json: bool) -> None:
    """Workers with their capacity, active and prefetched attempts at their last heartbeat."""
    found = queries.list_workers(ctx.db)
    if as_json:
        emit_json(found)
        return
    table(
        "Workers",
        ["worker", "state", "queues", "capacity", "active", "prefetched", "heartbeat"],
        [
            (
                w.worker_id,
                w.state,
                ",".join(w.queues),
                f"{w.concurrency}+{w.prefetch}",
                w.active,
                w.prefetched,
                fmt_time(w.last_heartbeat_at),
            )
            for w in found
        ],
    )
