"""`treadle` command: the composition root. Errors map to exit codes in one place."""

from __future__ import annotations

import gc
import getpass
import os
import sys
from collections.abc import Callable
from functools import cached_property
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from treadle.errors import ConfigError, Overloaded, SchemaOutOfDate, TreadleError

if TYPE_CHECKING:
    from treadle.config import Settings
    from treadle.config_file import LayeredSettings
    from treadle.store.database import Database

#: Mode of a TREADLE_HOME treadle creates: owner only.
PRIVATE_DIR_MODE = 0o700

EXIT_CODES: dict[type[TreadleError], int] = {ConfigError: 2, SchemaOutOfDate: 3, Overloaded: 75}


class Context:
    """Lazily built settings and database of one CLI invocation."""

    @cached_property
    def layered(self) -> LayeredSettings:
        """The settings file's variables overlaid by the environment's (config_file.py)."""
        from treadle import config_file

        return config_file.load(os.environ)

    @cached_property
    def settings(self) -> Settings:
        """Settings from the settings file and the environment (which wins)."""
        from treadle.config import Settings

        return Settings.from_env(self.layered.env)

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
        from treadle.store.sqlite_file import create_private_sqlite_file

        create_private_dir(self.settings.home)
        db = self.open_db(application_name, pool_size=10)
        from treadle.store import migrate  # after open_db: a URL it refuses needs no Alembic

        create_private_sqlite_file(db)
        migrate.upgrade(db)
        return db

    def open_db(self, application_name: str, *, pool_size: int = 5) -> Database:
        """The database of the settings, as it is (a SQLite file's missing folders are made)."""
        from treadle.store.database import Database

        url = self.settings.database_url
        make_sqlite_folder(url)
        db = Database(
            url,
            application_name=application_name,
            pool_size=pool_size,
            max_map_length=self.settings.max_map_length,
        )
        db.outbox_sinks = self.settings.outbox_sinks
        db.lineage_namespace = self.settings.lineage_namespace
        db.alerting = self.settings.alerting
        invocation = click.get_current_context(silent=True)
        if invocation is not None:  # closed when the command ends, before the interpreter exits
            invocation.find_root().call_on_close(db.dispose)
        return db


def make_sqlite_folder(url: str) -> None:
    """Create the missing folders (0700) of a SQLite URL's file; ConfigError naming one that fails."""
    from treadle.domain.urls import parse_database_url, sqlite_file

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
    from treadle.store import revisions

    current, head = revisions.current_revision(db), revisions.head_revision()
    revisions.refuse_newer(current)
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


#: Top-level commands: name -> (module of treadle.cli that defines it, its one-line help).
#: A command's module is imported only when that command runs, so `treadle --help` and every
#: command pay only for their own imports. Adding a command: one line here plus its module,
#: which registers it with `@cli.command(NAME)` or `@cli.group(NAME)`.
COMMANDS: dict[str, tuple[str, str]] = {
    "api": ("api", "Serve the REST API (under /api/v1; /healthz and /readyz for probes)."),
    "audit": ("accounts", "Show the audit log, newest first."),
    "backfill": (
        "backfills",
        "Run DAG_ID over the schedule intervals whose logical date is within --from ..",
    ),
    "backfills": ("backfills", "Backfills: requests to run a DAG over past intervals."),
    "bench": ("bench", "Measure treadle on fresh real processes and print tables (and JSON)."),
    "config": ("configuration", "Settings in effect and where each comes from (env, file, default)."),
    "dags": ("dags", "DAGs registered from the DAG folder."),
    "datasets": (
        "datasets",
        "Datasets: events recorded by tasks with `outlets=`, consumed by DAGs with `schedule=[Dataset]`.",
    ),
    "db": ("database", "Database schema and retention."),
    "dead-letters": ("dead_letters", "Task instances that failed for good."),
    "logs": ("logs", "Print the stdout and stderr of one attempt of a task."),
    "outbox": (
        "outbox",
        "Outbox: dataset events and alerts waiting for delivery (TREADLE_OUTBOX_WEBHOOK_URL).",
    ),
    "pools": ("pools", "Pools: slots that running task instances take (`pool=`, `pool_slots=` on a task)."),
    "queues": ("operations", "Queue depth, oldest queued age, and the live workers serving each queue."),
    "runs": ("runs", "DAG runs."),
    "scheduler": (
        "processes",
        "Fire schedules, apply due retries, reap expired leases, close finished runs.",
    ),
    "standalone": (
        "processes",
        "Scheduler, worker and REST API in one process (migrates the database first).",
    ),
    "tasks": ("tasks", "Tasks of a DAG."),
    "teams": ("accounts", "Teams: DAGs belong to one (`@dag(team=...)`), roles are granted per team."),
    "tokens": ("accounts", "API tokens (shown once, stored hashed)."),
    "users": ("accounts", "Users and their roles per team."),
    "why": (
        "operations",
        "Why is a task not running? The first condition holding each task instance, and who holds it.",
    ),
    "worker": ("processes", "Claim and run task attempts."),
    "workers": (
        "operations",
        "Workers with their capacity, active and prefetched attempts at their last heartbeat.",
    ),
}


class Group(click.Group):
    """The root group: loads a command's module on first use; TreadleErrors become exit codes."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            import_module(f"treadle.cli.{COMMANDS[cmd_name][0]}")
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands from COMMANDS without importing their modules."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(name, _short_help(self.commands.get(name), name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TreadleError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exit_code(exc))


def _short_help(command: click.Command | None, name: str, limit: int) -> str:
    """A command's line in `treadle --help`: from the command if loaded, else from COMMANDS."""
    if command is not None:
        return command.get_short_help_str(limit)
    return click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit)


def exit_code(exc: TreadleError) -> int:
    """The exit code of the nearest class of `exc` in EXIT_CODES (1 if none)."""
    return next((EXIT_CODES[c] for c in type(exc).__mro__ if c in EXIT_CODES), 1)


@click.group(cls=Group)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Settings file [default: $TREADLE_HOME/treadle.toml if it exists].",
)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """treadle: workflow orchestrator and distributed job scheduler.

    Settings come from TREADLE_* environment variables, then from the settings file
    (`treadle config show` prints them with their source), then from their defaults.
    """
    if config_path is not None:
        # In the environment, so the processes this one starts read the same file.
        os.environ["TREADLE_CONFIG"] = str(Path(config_path).expanduser().absolute())
    ctx.obj = Context()


pass_context: Callable[..., Any] = click.make_pass_decorator(Context)


def main() -> None:
    """Console-script entry point."""
    try:
        cli(prog_name="treadle")
    finally:
        _before_exit()


def _before_exit() -> None:
    """Spare the interpreter's exit a last collection over everything imported: a tenth of a
    short command's CPU, for nothing, as the databases the command opened are closed when it
    ends (`Context.open_db`) and no finalizer treadle relies on is left to that collection."""
    gc.freeze()
