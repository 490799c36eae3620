"""`treadle runs`: list, show and cancel."""

from __future__ import annotations

import json
from typing import Any

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, fmt_duration, fmt_time, show_cancellation, table
from treadle.domain.mapping import instance_label
from treadle.engine import queries


@cli.group("runs")
def runs_group() -> None:
    """DAG runs."""


@runs_group.command("list")
@click.argument("dag_id", required=False)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_cmd(ctx: Context, dag_id: str | None, limit: int, as_json: bool) -> None:
    """List the newest runs, optionally of one DAG."""
    found = queries.list_runs(ctx.db, dag_id=dag_id, limit=limit)
    if as_json:
        emit_json(found)
        return
    table(
        "Runs",
        ["run id", "dag id", "state", "type", "triggered by", "started", "ended"],
        [
            (
                r.run_id,
                r.dag_id,
                r.state,
                r.run_type,
                r.triggered_by,
                fmt_time(r.started_at),
                fmt_time(r.ended_at),
            )
            for r in found
        ],
    )


@runs_group.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def show_cmd(ctx: Context, run_id: str, as_json: bool) -> None:
    """Show a run: its task instances, every attempt, durations and results."""
    detail = queries.run_detail(ctx.db, run_id)
    if as_json:
        emit_json(detail)
        return
    r = detail.run
    click.echo(f"run {r.run_id}  dag {r.dag_id}  state {r.state}  by {r.triggered_by}")
    click.echo(f"started {fmt_time(r.started_at)}  ended {fmt_time(r.ended_at)}  conf {json.dumps(r.conf)}")
    attempts_by_ti: dict[int, int] = {}
    for a in detail.attempts:
        attempts_by_ti[a.task_instance_id] = attempts_by_ti.get(a.task_instance_id, 0) + 1
    table(
        "Task instances",
        ["task", "state", "attempts", "duration", "worker", "result"],
        [
            (
                instance_label(t.task_id, t.map_index),
                t.state + (f" ({t.dead_letter_reason})" if t.dead_letter_reason else ""),
                attempts_by_ti.get(t.id, 0),
                fmt_duration(
                    (t.ended_at - t.started_at).total_seconds() if t.ended_at and t.started_at else None
                ),
                t.worker_id,
                _short(_result_of(detail.results, t.task_id, t.map_index)),
            )
            for t in detail.task_instances
        ],
    )
    labels = {t.id: instance_label(t.task_id, t.map_index) for t in detail.task_instances}
    table(
        "Attempts",
        ["task", "#", "outcome", "exit", "duration", "error", "retry in", "host", "code"],
        [
            (
                labels.get(a.task_instance_id, a.task_id),
                a.attempt,
                a.outcome + (f" [{a.late_result}]" if a.late_result else ""),
                "" if a.exit_code is None else a.exit_code,
                fmt_duration(a.duration_s),
                f"{a.error_type}: {a.error_message}"[:120] if a.error_type else "",
                fmt_duration(a.retry_delay_s),
                a.hostname,
                (a.code_version or "")[:12],
            )
            for a in detail.attempts
        ],
    )


def _result_of(results: dict[str, Any], task_id: str, map_index: int) -> Any:
    """A task instance's result: a mapped instance's is its entry in its task's list."""
    value = results.get(task_id)
    if map_index < -1:
        return None  # retired: its result is no longer its task's
    if map_index >= 0:
        return value[map_index] if isinstance(value, list) and map_index < len(value) else None
    return value


def _short(value: object) -> str:
    if value is None:
        return ""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


@runs_group.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="", help="Why (recorded in the audit log).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def cancel_run_cmd(ctx: Context, run_id: str, reason: str, as_json: bool) -> None:
    """Cancel a run: running attempts are killed, nothing else starts."""
    from treadle.engine import cancellation  # not for the read commands: it needs the engine's writers

    show_cancellation(cancellation.cancel_run(ctx.db, run_id, actor=identity(), reason=reason), as_json)
