"""`treadle` command: the composition root. Errors map to exit codes in one place."""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from functools import cached_property
from typing import Any

import click

from treadle.config import Settings
from treadle.errors import ConfigError, SchemaOutOfDate, TreadleError
from treadle.store import migrate
from treadle.store.database import Database

EXIT_CODES: dict[type[TreadleError], int] = {ConfigError: 2, SchemaOutOfDate: 3}


class Context:
    """Lazily built settings and database of one CLI invocation."""

    @cached_property
    def settings(self) -> Settings:
        """Settings from the environment."""
        return Settings.from_env()

    @cached_property
    def db(self) -> Database:
        """The database, checked to be at the code's schema revision."""
        db = Database(self.settings.database_url, application_name="treadle-cli")
        require_schema(db)
        return db

    def db_upgraded(self, application_name: str) -> Database:
        """The database, migrated to head first (processes that own a SQLite file do this)."""
        self.settings.home.mkdir(parents=True, exist_ok=True)
        db = Database(self.settings.database_url, application_name=application_name, pool_size=10)
        migrate.upgrade(db)
        return db


def require_schema(db: Database) -> None:
    """Raise SchemaOutOfDate unless the database is at head."""
    current, head = migrate.current_revision(db), migrate.head_revision()
    if current != head:
        raise SchemaOutOfDate(
            f"database schema is at {current or 'nothing'}, code expects {head}; run `treadle db upgrade`"
        )


def identity() -> str:
    """Who is running this command (recorded on the runs it triggers)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}"


class Group(click.Group):
    """A click group that turns TreadleErrors into a message and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TreadleError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_CODES.get(type(exc), 1))


@click.group(cls=Group)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """treadle: workflow orchestrator and distributed job scheduler."""
    ctx.obj = Context()


pass_context: Callable[..., Any] = click.make_pass_decorator(Context)


def main() -> None:
    """Console-script entry point."""
    from treadle.cli import (  # noqa: F401  (registers the commands)
        backfills,
        dags,
        database,
        datasets,
        dead_letters,
        operations,
        pools,
        processes,
        runs,
        tasks,
    )

    cli(prog_name="treadle")
