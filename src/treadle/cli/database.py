"""`treadle db`: schema migrations."""

from __future__ import annotations

import click

from treadle.cli.main import Context, cli, pass_context
from treadle.errors import SchemaOutOfDate
from treadle.store import migrate


@cli.group("db")
def db_group() -> None:
    """Database schema."""


@db_group.command("upgrade")
@pass_context
def upgrade(ctx: Context) -> None:
    """Migrate the database to the newest schema (idempotent)."""
    db = ctx.db_upgraded("treadle-cli")
    click.echo(f"database at revision {migrate.current_revision(db)} ({db.dialect})")


@db_group.command("check")
@pass_context
def check(ctx: Context) -> None:
    """Exit non-zero unless the schema is at the code's revision and matches its tables."""
    from treadle.store.database import Database

    db = Database(ctx.settings.database_url, application_name="treadle-cli")
    current, head = migrate.current_revision(db), migrate.head_revision()
    if current != head:
        raise SchemaOutOfDate(f"database at {current or 'nothing'}, code expects {head}")
    differences = migrate.drift(db)
    if differences:
        raise SchemaOutOfDate("schema differs from the code's tables: " + "; ".join(differences))
    click.echo(f"ok: revision {current}, no drift ({db.dialect})")
