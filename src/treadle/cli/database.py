"""`treadle db`: schema migrations and pruning of old history."""

from __future__ import annotations

import functools
from datetime import timedelta

import click

from treadle.authoring.artifacts import delete_run_files
from treadle.cli.main import Context, cli, pass_context, require_schema
from treadle.cli.render import emit_json, fmt_time, table
from treadle.domain.durations import ACCEPTED_FORMS, parse_duration
from treadle.engine import retention
from treadle.errors import SchemaOutOfDate
from treadle.store import migrate
from treadle.worker.run_files import remove_files_of_pruned_runs


@cli.group("db")
def db_group() -> None:
    """Database schema and retention."""


@db_group.command("upgrade")
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Print the DDL instead of applying it (for a DBA to review and apply); changes nothing.",
)
@click.option(
    "--from",
    "from_revision",
    default=None,
    metavar="REV",
    help="With --sql: the revision the database is at (default: read from the database; "
    "none recorded: an empty database).",
)
@pass_context
def upgrade(ctx: Context, as_sql: bool, from_revision: str | None) -> None:
    """Migrate the database to the newest schema (idempotent)."""
    if from_revision is not None and not as_sql:
        raise click.UsageError("--from only applies with --sql")
    if as_sql:
        _print_upgrade_sql(ctx, from_revision)
        return
    db = ctx.db_upgraded("treadle-cli")
    click.echo(f"database at revision {migrate.current_revision(db)} ({db.dialect})")


def _print_upgrade_sql(ctx: Context, from_revision: str | None) -> None:
    """Print the upgrade's DDL for the configured database's dialect (offline: nothing runs)."""
    known = migrate.known_revisions()
    if from_revision is not None and from_revision not in known:
        raise click.BadParameter(
            f"unknown revision {from_revision!r}; this treadle knows {', '.join(known)}",
            param_hint="--from",
        )
    db = ctx.open_db("treadle-cli")
    if from_revision is None:
        from_revision = migrate.current_revision(db)
        migrate.refuse_newer(from_revision)
    ddl = migrate.upgrade_sql(db.dialect, from_revision)
    if not ddl:
        click.echo(f"-- database already at revision {migrate.head_revision()}: nothing to apply")
        return
    click.echo(ddl, nl=False)


@db_group.command("check")
@pass_context
def check(ctx: Context) -> None:
    """Exit non-zero unless the schema is at the code's revision and matches its tables."""
    db = ctx.open_db("treadle-cli")
    require_schema(db)
    current = migrate.current_revision(db)
    differences = migrate.drift(db)
    if differences:
        raise SchemaOutOfDate("schema differs from the code's tables: " + "; ".join(differences))
    click.echo(f"ok: revision {current}, no drift ({db.dialect})")


@db_group.command("prune")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="AGE",
    help=f"Prune finished history older than AGE: {ACCEPTED_FORMS}.",
)
@click.option(
    "--audit-older-than",
    "audit_older_than",
    default=None,
    metavar="AGE",
    help="Prune audit entries older than AGE (at least --older-than) [TREADLE_AUDIT_RETENTION_DAYS; "
    "unset: the audit log is kept].",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--batch-runs",
    default=retention.DEFAULT_BATCH_RUNS,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Runs deleted per transaction.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def prune(
    ctx: Context, older_than: str, audit_older_than: str | None, dry_run: bool, batch_runs: int, as_json: bool
) -> None:
    """Delete finished runs (with their attempts and results) and gone workers; audit entries
    only past the audit log's own, longer retention.

    Only runs that ended (success, failed, cancelled) before the cutoff are deleted; the cutoff
    is the database's clock minus AGE. Deletion goes in small batches, one transaction each.
    Audit entries are deleted whole, never edited.
    """
    # Parsed before connecting, so a typo is reported even when the database is down.
    age = parse_duration(older_than)
    audit_age = _audit_age(ctx, audit_older_than)
    retention.check_ages(age, audit_age)
    report = retention.prune(
        ctx.db,
        older_than=age,
        audit_older_than=audit_age,
        dry_run=dry_run,
        batch_runs=batch_runs,
        on_deleted=functools.partial(
            delete_run_files, ctx.settings.home, artifacts_url=ctx.settings.artifacts_url
        ),
    )
    if not dry_run:
        # This host's manifests, outputs and logs of pruned runs (also of runs pruned elsewhere).
        remove_files_of_pruned_runs(ctx.db, runs_dir=ctx.settings.runs_dir, logs_dir=ctx.settings.logs_dir)
    if as_json:
        emit_json(report)
        return
    click.echo(f"cutoff {fmt_time(report.cutoff)} (database time minus {older_than})")
    if report.audit_cutoff is None:
        click.echo("audit log kept (no --audit-older-than, TREADLE_AUDIT_RETENTION_DAYS unset)")
    else:
        click.echo(f"audit entries before {fmt_time(report.audit_cutoff)}")
    table(
        "Would delete (dry run)" if dry_run else f"Deleted in {report.batches} batches",
        ["table", "rows"],
        [*report.rows.by_table().items(), ("total", report.rows.total)],
    )


def _audit_age(ctx: Context, audit_older_than: str | None) -> timedelta | None:
    """--audit-older-than, else TREADLE_AUDIT_RETENTION_DAYS (None: the audit log is kept)."""
    if audit_older_than is not None:
        return parse_duration(audit_older_than)
    days = ctx.settings.audit_retention_days
    return timedelta(days=days) if days > 0 else None
