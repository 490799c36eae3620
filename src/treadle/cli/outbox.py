"""`treadle outbox`: effects waiting for delivery, dead ones, replay and purge (audited)."""

from __future__ import annotations

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, table
from treadle.domain.durations import parse_duration
from treadle.domain.outbox import OutboxState
from treadle.engine import outbox
from treadle.errors import InvalidRequest


@cli.group("outbox")
def outbox_group() -> None:
    """Outbox: dataset events and alerts waiting for delivery (TREADLE_OUTBOX_WEBHOOK_URL)."""


@outbox_group.command("list")
@click.option(
    "--state", type=click.Choice([s.value for s in OutboxState]), default=None, help="Only this state."
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_cmd(ctx: Context, state: str | None, limit: int, as_json: bool) -> None:
    """List entries, newest first, with their attempts and last error."""
    found = outbox.list_entries(ctx.db, state=state, limit=limit)
    if as_json:
        emit_json(found)
        return
    table(
        "Outbox",
        ["id", "kind", "sink", "state", "attempts", "created", "next try", "last error"],
        [
            (
                e.id,
                e.kind,
                e.sink,
                e.state,
                e.attempts,
                e.created_at,
                e.next_attempt_at,
                (e.last_error or "")[:80],
            )
            for e in found
        ],
    )


@outbox_group.command("replay")
@click.argument("ids", nargs=-1, type=int)
@click.option("--all-dead", is_flag=True, help="Replay every dead entry.")
@pass_context
def replay_cmd(ctx: Context, ids: tuple[int, ...], all_dead: bool) -> None:
    """Deliver dead entries IDS again, with a fresh budget of attempts."""
    if bool(ids) == all_dead:
        raise InvalidRequest("give the ids of dead entries to replay, or --all-dead (not both)")
    count = outbox.replay(ctx.db, ids=None if all_dead else list(ids), actor=identity())
    click.echo(f"replayed {count} dead entr{'y' if count == 1 else 'ies'}")


@outbox_group.command("purge")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([OutboxState.DELIVERED.value, OutboxState.DEAD.value]),
    default=[OutboxState.DELIVERED.value],
    show_default=True,
    help="States to purge (repeatable).",
)
@click.option(
    "--older-than", default="7d", show_default=True, help="Age of the entries to delete (30m, 12h, 7d)."
)
@pass_context
def purge_cmd(ctx: Context, states: tuple[str, ...], older_than: str) -> None:
    """Delete delivered (or dead) entries older than --older-than."""
    count = outbox.purge(ctx.db, states=list(states), older_than=parse_duration(older_than), actor=identity())
    click.echo(f"purged {count} entr{'y' if count == 1 else 'ies'}")
