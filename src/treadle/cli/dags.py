"""`treadle dags`: list, sync, errors, trigger."""

from __future__ import annotations

import json

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, fmt_time, table
from treadle.engine import queries
from treadle.engine.runs import trigger_run
from treadle.errors import InvalidRequest


@cli.group("dags")
def dags_group() -> None:
    """DAGs registered from the DAG folder."""


@dags_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_cmd(ctx: Context, as_json: bool) -> None:
    """List registered DAGs."""
    found = queries.list_dags(ctx.db)
    if as_json:
        emit_json(found)
        return
    table(
        "DAGs",
        ["dag id", "owner", "tags", "version", "paused", "file"],
        [
            (
                d.dag_id,
                d.owner,
                ",".join(d.tags),
                (d.version_hash or "")[:12],
                d.is_paused,
                d.fileloc,
            )
            for d in found
        ],
    )


@dags_group.command("sync")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def sync_cmd(ctx: Context, as_json: bool) -> None:
    """Import the DAG folder now and register its DAGs and load errors (for deploy pipelines)."""
    from treadle.worker.worker import sync_dag_folder

    report = sync_dag_folder(ctx.db, ctx.settings.dags_folder)
    if as_json:
        emit_json(report)
        return
    click.echo(
        f"synced {report.dags} DAG(s) from {ctx.settings.dags_folder}; "
        f"{report.errors} file(s) with load errors"
    )
    if report.errors:
        click.echo("see `treadle dags errors`")


@dags_group.command("errors")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--traceback", "show_tb", is_flag=True, help="Show full tracebacks.")
@pass_context
def errors_cmd(ctx: Context, as_json: bool, show_tb: bool) -> None:
    """Show DAG files that failed to load, with their error."""
    errors = queries.list_load_errors(ctx.db)
    if as_json:
        emit_json(errors)
        return
    if not errors:
        click.echo("no DAG load errors")
        return
    table(
        "DAG load errors",
        ["file", "error", "recorded"],
        [(e.fileloc, e.message, fmt_time(e.recorded_at)) for e in errors],
    )
    if show_tb:
        for e in errors:
            click.echo(f"\n{e.fileloc}\n{e.traceback}")


@dags_group.command("trigger")
@click.argument("dag_id")
@click.option("--conf", default="{}", help="Run parameters as a JSON object.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def trigger_cmd(ctx: Context, dag_id: str, conf: str, as_json: bool) -> None:
    """Start a manual run of DAG_ID."""
    try:
        parsed = json.loads(conf)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"--conf is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("--conf must be a JSON object")
    run = trigger_run(
        ctx.db,
        dag_id,
        conf=parsed,
        triggered_by=identity(),
        default_queue_timeout_s=ctx.settings.queue_timeout_s,
    )
    if as_json:
        emit_json(run)
        return
    click.echo(f"triggered {run.run_id}")
