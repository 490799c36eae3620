"""`treadle dags`: list, show, sync, errors, trigger, pause, unpause, next.

What only `show` or `trigger` needs (the DAG detail, params validation with jsonschema) is
imported by those commands, so `dags list` does not pay for it.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, fmt_time, table, to_jsonable
from treadle.domain.conf_limits import check_conf_depth, json_text_depth
from treadle.engine import queries
from treadle.engine.pausing import set_paused
from treadle.engine.schedules import describe, list_schedules, schedule_view, upcoming
from treadle.errors import InvalidRequest


@cli.group("dags")
def dags_group() -> None:
    """DAGs registered from the DAG folder."""


@dags_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_cmd(ctx: Context, as_json: bool) -> None:
    """List registered DAGs with their schedule and next fire time, active or not.

    A DAG is inactive when the last sync of the DAG folder found its file deleted or no longer
    defining it: its runs stay, it cannot be triggered and its schedule does not fire.
    """
    found = queries.list_dags(ctx.db)
    schedules = list_schedules(ctx.db)
    if as_json:
        emit_json(
            [
                {
                    **to_jsonable(d),
                    "schedule": schedules[d.dag_id].spec or None if d.dag_id in schedules else None,
                    "next_fire_at": to_jsonable(schedules[d.dag_id].next_fire_at)
                    if d.dag_id in schedules and d.is_active
                    else None,
                }
                for d in found
            ]
        )
        return
    folder = common_folder([d.fileloc for d in found])
    table(
        f"DAGs (files in {folder}/)" if folder else "DAGs",
        ["dag id", "schedule", "next fire", "paused", "active", "owner", "tags", "version", "file"],
        [
            (
                d.dag_id,
                describe(schedules[d.dag_id].spec) if d.dag_id in schedules else "manual",
                fmt_time(schedules[d.dag_id].next_fire_at) if d.dag_id in schedules and d.is_active else "",
                d.is_paused,
                "yes" if d.is_active else "no: file gone or no longer defines it",
                d.owner,
                ",".join(d.tags),
                (d.version_hash or "")[:12],
                os.path.relpath(d.fileloc, folder) if folder else d.fileloc,
            )
            for d in found
        ],
    )


def common_folder(files: list[str]) -> str:
    """The folder every one of `files` lies in ("" if none, or if they share none): the table
    names it once in its title and shows each file from there (JSON keeps the whole path)."""
    folders = [os.path.dirname(f) for f in files if f]
    if not folders or len(folders) != len(files):
        return ""
    try:
        common = os.path.commonpath(folders)
    except ValueError:  # absolute and relative paths mixed
        return ""
    return "" if common in ("", os.sep) else common


@dags_group.command("show")
@click.argument("dag_id")
@click.option(
    "--runs", "runs", default=10, show_default=True, type=click.IntRange(0, 1000), help="Latest runs."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def show_cmd(ctx: Context, dag_id: str, runs: int, as_json: bool) -> None:
    """Show DAG_ID: contract, schedule and next fire times, tasks in order, params, latest runs."""
    from treadle.cli import dag_show
    from treadle.engine.dag_detail import dag_detail

    detail = dag_detail(ctx.db, dag_id, runs=runs)
    default_timeout_s = ctx.settings.default_task_timeout_s
    if as_json:
        emit_json(dag_show.as_json(detail, default_timeout_s=default_timeout_s))
        return
    dag_show.print_text(detail, default_timeout_s=default_timeout_s)


@dags_group.command("sync")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def sync_cmd(ctx: Context, as_json: bool) -> None:
    """Import the DAG folder now and register its DAGs and load errors (for deploy pipelines).

    DAGs whose file is gone or no longer defines them become inactive (their history stays);
    one that comes back is active again.
    """
    from treadle.worker.worker import sync_dag_folder

    report, _ = sync_dag_folder(
        ctx.db, ctx.settings.dags_folder, file_limit_s=ctx.settings.dag_import_timeout_s
    )
    if as_json:
        emit_json(report)
        return
    click.echo(
        f"synced {report.dags} DAG(s) from {ctx.settings.dags_folder}; "
        f"{report.errors} file(s) with load errors"
    )
    for dag_id, fileloc in report.deactivated:
        click.echo(
            f"DAG {dag_id} is now inactive: {fileloc} is gone or no longer defines it; it cannot be "
            "triggered and its schedule does not fire until a sync finds it again"
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
    from treadle.engine.runs import trigger_run  # with jsonschema: only this command of the group needs it

    # Parsed before connecting, so bad input is reported even when the database is not usable.
    parsed = parse_conf(conf)
    run = trigger_run(
        ctx.db,
        dag_id,
        conf=parsed,
        triggered_by=identity(),
        default_queue_timeout_s=ctx.settings.queue_timeout_s,
        default_task_timeout_s=ctx.settings.default_task_timeout_s,
        admission=ctx.settings.admission_limits,
    )
    if as_json:
        emit_json(queries.run_for_operators(ctx.db, run))
        return
    click.echo(f"triggered {run.run_id}")


def parse_conf(text: str) -> dict[str, Any]:
    """The --conf JSON object; InvalidRequest if it is not one or is nested too deep to parse."""
    check_conf_depth(json_text_depth(text), source="--conf")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"--conf is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("--conf must be a JSON object")
    return parsed


@dags_group.command("pause")
@click.argument("dag_id")
@pass_context
def pause_cmd(ctx: Context, dag_id: str) -> None:
    """Pause DAG_ID: no scheduled, dataset or backfill runs start; running ones go on."""
    changed = set_paused(ctx.db, dag_id, paused=True, actor=identity())
    click.echo(f"paused {dag_id}" if changed else f"{dag_id} was already paused")


@dags_group.command("unpause")
@click.argument("dag_id")
@pass_context
def unpause_cmd(ctx: Context, dag_id: str) -> None:
    """Unpause DAG_ID: missed intervals run per its catchup policy (off: only the latest)."""
    changed = set_paused(ctx.db, dag_id, paused=False, actor=identity())
    click.echo(f"unpaused {dag_id}" if changed else f"{dag_id} was not paused")


@dags_group.command("next")
@click.argument("dag_id")
@click.option("-n", "count", default=5, show_default=True, type=click.IntRange(1, 1000), help="How many.")
@click.option(
    "--after",
    default=None,
    help="ISO time to start from (default: now); without an offset it is read in the DAG's time zone.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def next_cmd(ctx: Context, dag_id: str, count: int, after: str | None, as_json: bool) -> None:
    """Print the next fire times of DAG_ID (UTC and local) with the data interval each run covers.

    A scheduled run covers [data interval start, end) and fires at its end; its logical date is
    the interval's start.
    """
    view = schedule_view(ctx.db, dag_id)
    spec = view.spec
    if spec is None or not spec.is_timed:
        what = (
            "runs only when triggered"
            if spec is None
            else f"runs when every one of its datasets has a new event: {', '.join(spec.datasets)}"
        )
        if as_json:
            emit_json({"dag_id": dag_id, "schedule": spec.to_json() if spec else None, "fires": []})
        else:
            click.echo(f"{dag_id} {what}")
        return
    zone = ZoneInfo(spec.timezone)
    start = view.now if after is None else _parse_after(after, zone)
    slots = upcoming(spec, after=start, count=count)
    if as_json:
        emit_json(
            {
                "dag_id": dag_id,
                "schedule": spec.to_json(),
                "paused": view.is_paused,
                "active": view.is_active,
                "after": start.isoformat(),
                "fires": [
                    {
                        "fire_at": s.fire_at.isoformat(),
                        "fire_at_local": s.fire_at.astimezone(zone).isoformat(),
                        "logical_date": s.logical_date.isoformat(),
                        "data_interval_start": s.data_interval_start.isoformat(),
                        "data_interval_end": s.data_interval_end.isoformat(),
                    }
                    for s in slots
                ],
            }
        )
        return
    what = f"cron {spec.cron!r}" if spec.kind == "cron" else f"every {spec.interval_s:g} s"

    def local(value: datetime) -> str:
        return value.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")

    table(
        f"next fire times of {dag_id} ({what}, {spec.timezone}, catchup {'on' if spec.catchup else 'off'}"
        f"{', PAUSED' if view.is_paused else ''}"
        f"{'' if view.is_active else ', INACTIVE: its file is gone or no longer defines it, nothing fires'})",
        ["fire (UTC)", "fire (local)", "logical date (local)", "data interval (local)"],
        [
            (
                fmt_time(s.fire_at),
                local(s.fire_at),
                local(s.logical_date),
                f"{local(s.data_interval_start)} -> {local(s.data_interval_end)}",
            )
            for s in slots
        ],
    )


def _parse_after(text: str, zone: ZoneInfo) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(f"--after {text!r} is not an ISO-8601 time") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    return value.astimezone(UTC)
