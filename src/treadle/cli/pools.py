"""`treadle pools`: named slot budgets."""

from __future__ import annotations

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, table
from treadle.engine import pools


@cli.group("pools")
def pools_group() -> None:
    """Pools: slots that running task instances take (`pool=`, `pool_slots=` on a task)."""


@pools_group.command("set")
@click.argument("name")
@click.argument("slots", type=int)
@click.option("--description", default=None, help="What the pool protects.")
@pass_context
def set_cmd(ctx: Context, name: str, slots: int, description: str | None) -> None:
    """Create pool NAME with SLOTS slots, or resize it."""
    created = pools.set_pool(ctx.db, name, slots=slots, description=description, actor=identity())
    click.echo(f"{'created' if created else 'updated'} pool {name} with {slots} slot(s)")


@pools_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_cmd(ctx: Context, as_json: bool) -> None:
    """List pools with slots in use, running and queued task instances."""
    found = pools.list_pools(ctx.db)
    if as_json:
        emit_json(found)
        return
    table(
        "Pools",
        ["pool", "slots", "used", "running", "queued", "description"],
        [(p.name, p.slots, p.used_slots, p.running, p.queued, p.description) for p in found],
    )


@pools_group.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete even while task instances use it.")
@pass_context
def delete_cmd(ctx: Context, name: str, force: bool) -> None:
    """Delete pool NAME."""
    pools.delete_pool(ctx.db, name, actor=identity(), force=force)
    click.echo(f"deleted pool {name}")
