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
from treadle.domain.urls import parse_database_url, sqlite_file
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
        db = self.open_db("treadle-cli")
        require_schema(db)
        return db

    def db_upgraded(self, application_name: str) -> Database:
        """The database, migrated to head first (processes that own a SQLite file do this).

        TREADLE_HOME and the SQLite file are created private (0700, 0600) whatever the umask:
        they hold run params and results.
        """
        create_private_dir(self.settings.home)
        db = self.open_db(application_name, pool_size=10)
        create_private_sqlite_file(db)
        migrate.upgrade(db)
        return db

    def open_db(self, application_name: str, *, pool_size: int = 5) -> Database:
        """The database of the settings, as it is (a SQLite file's missing folders are made)."""
        url = self.settings.database_url
        make_sqlite_folder(url)
        db = Database(
            url,
            application_name=application_name,
            pool_size=pool_size,
            max_map_length=self.settings.max_map_length,
        )
        db.outbox_sinks = self.settings.outbox_sinks
        return db


def make_sqlite_folder(url: str) -> None:
    """Create the missing folders (0700) of a SQLite URL's file; ConfigError naming one that fails."""
    path = sqlite_file(parse_database_url(url))
    if path is None:
        return
    folder = Path(path).absolute().parent
    missing = [p for p in (folder, *folder.parents) if not p.is_dir()]
    for p in reversed(missing):
        problem = "a file is in the way" if p.exists() else _mkdir_problem(p)
        if problem:
            raise ConfigError(f"cannot create folder {p} for the SQLite database {path}: {problem}")


def _mkdir_problem(folder: Path) -> str | None:
    """Make `folder` (0700); the reason it could not be made, or None."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def create_private_dir(path: Path) -> None:
    """Create `path` (and missing parents) unless it exists, the last part with mode 0700."""
    if path.is_dir():
        return
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    path.chmod(PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask; this does not


def require_schema(db: Database) -> None:
    """Raise SchemaTooNew or SchemaOutOfDate unless the database is at head."""
    current, head = migrate.current_revision(db), migrate.head_revision()
    migrate.refuse_newer(current)
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
            sys.exit(exit_code(exc))


def exit_code(exc: TreadleError) -> int:
    """The exit code of the nearest class of `exc` in EXIT_CODES (1 if none)."""
    return next((EXIT_CODES[c] for c in type(exc).__mro__ if c in EXIT_CODES), 1)


@click.group(cls=Group)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """treadle: workflow orchestrator and distributed job scheduler."""
    ctx.obj = Context()


pass_context: Callable[..., Any] = click.make_pass_decorator(Context)


def main() -> None:
    """Console-script entry point."""
    from treadle.cli import (  # noqa: F401  (registers the commands)
        accounts,
        api,
        backfills,
        bench,
        dags,
        database,
        datasets,
        dead_letters,
        logs,
        operations,
        outbox,
        pools,
        processes,
        runs,
        tasks,
    )

    cli(prog_name="treadle")
