"""`treadle` command: the composition root. Errors map to exit codes in one place."""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import click

from treadle.config import Settings
from treadle.errors import ConfigError, SchemaOutOfDate, TreadleError
from treadle.store import migrate
from treadle.store.database import Database
from treadle.store.sqlite_file import create_private_sqlite_file

#: Mode of a TREADLE_HOME treadle creates: owner only.
PRIVATE_DIR_MODE = 0o700

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
        """The database, migrated to head first (processes that own a SQLite file do this).

        TREADLE_HOME and the SQLite file are created private (0700, 0600) whatever the umask:
        they hold run params and results.
        """
        create_private_dir(self.settings.home)
        db = Database(self.settings.database_url, application_name=application_name, pool_size=10)
        create_private_sqlite_file(db)
        migrate.upgrade(db)
        return db


def create_private_dir(path: Path) -> None:
    """Create `path` (and missing parents) unless it exists, the last part with mode 0700."""
    if path.is_dir():
        return
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    path.chmod(PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask; this does not


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
