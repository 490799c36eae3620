"""`treadle dead-letters`: inspect (grouped by error fingerprint) and requeue."""

from __future__ import annotations

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, fmt_time, table
from treadle.domain.mapping import instance_label
from treadle.engine import dead_letters as letters
from treadle.errors import InvalidRequest


@cli.group("dead-letters")
def dead_letters_group() -> None:
    """Task instances that failed for good."""


@dead_letters_group.command("list")
@click.option("--group", "grouped", is_flag=True, help="Group by error fingerprint, with counts.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_cmd(ctx: Context, grouped: bool, as_json: bool) -> None:
    """List dead letters."""
    found = letters.list_dead_letters(ctx.db)
    if grouped:
        groups = letters.group_dead_letters(found)
        if as_json:
            emit_json(groups)
            return
        table(
            "Dead letters by fingerprint",
            ["fingerprint", "count", "error", "dags"],
            [
                (g.fingerprint, g.count, f"{g.error_type}: {g.message}"[:120], ",".join(g.dag_ids))
                for g in groups
            ],
        )
        return
    if as_json:
        emit_json([{**_row(d), "fingerprint": d.fingerprint} for d in found])
        return
    table(
        "Dead letters",
        ["id", "run", "task", "reason", "attempts", "error", "fingerprint", "ended"],
        [
            (
                d.task_instance.id,
                d.task_instance.run_id,
                instance_label(d.task_instance.task_id, d.task_instance.map_index),
                d.task_instance.dead_letter_reason,
                d.task_instance.attempt,
                (
                    f"{d.last_attempt.error_type}: {d.last_attempt.error_message}"[:100]
                    if d.last_attempt
                    else ""
                ),
                d.fingerprint,
                fmt_time(d.task_instance.ended_at),
            )
            for d in found
        ],
    )


def _row(d: letters.DeadLetter) -> dict[str, object]:
    from treadle.cli.render import to_jsonable

    data: dict[str, object] = to_jsonable(d)
    return data


@dead_letters_group.command("requeue")
@click.argument("task_instance_id", required=False, type=int)
@click.option("--fingerprint", "fp", help="Requeue every dead letter with this fingerprint.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def requeue_cmd(ctx: Context, task_instance_id: int | None, fp: str | None, as_json: bool) -> None:
    """Queue dead letters again with a fresh retry budget (their downstream and run reopen)."""
    if (task_instance_id is None) == (fp is None):
        raise InvalidRequest("give exactly one of TASK_INSTANCE_ID or --fingerprint")
    if fp is not None:
        group = letters.requeue_fingerprint(ctx.db, fp, actor=identity())
        done = group.requeued
        for instance_id, why in group.refused:
            click.echo(f"not requeued: task instance {instance_id}: {why}", err=True)
    else:
        assert task_instance_id is not None
        done = [letters.requeue_dead_letter(ctx.db, task_instance_id, actor=identity())]
    if as_json:
        emit_json(done)
        return
    for t in done:
        click.echo(f"requeued task instance {t.id} ({t.run_id} / {instance_label(t.task_id, t.map_index)})")
