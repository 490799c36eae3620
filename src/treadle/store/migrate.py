"""Schema migrations: upgrade to head, report the current revision, check for drift."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from treadle.errors import DatabaseUnavailable, SchemaTooNew
from treadle.store.database import Database, redact
from treadle.store.tables import metadata

_SCRIPTS = str(Path(__file__).parent / "migrations")


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", _SCRIPTS)
    return cfg


def head_revision() -> str:
    """Return the newest revision this code knows."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def known_revisions() -> frozenset[str]:
    """Every revision this code's migrations define."""
    return frozenset(rev.revision for rev in ScriptDirectory.from_config(_config()).walk_revisions())


def refuse_newer(current: str | None) -> None:
    """Raise SchemaTooNew if the database is at a revision this code does not know.

    The chain is linear, so a revision we know is head or older; one we do not know was written
    by a newer treadle (or one from another branch), and no downgrade path from it exists here.
    """
    if current is not None and current not in known_revisions():
        raise SchemaTooNew(revision=current, expected=head_revision())


def current_revision(db: Database) -> str | None:
    """Return the revision the database is at (None if never migrated)."""
    if db.is_sqlite and not _sqlite_exists(db):
        return None
    try:
        with db.engine.connect() as raw:
            conn = raw.execution_options(treadle_readonly=True)
            return MigrationContext.configure(conn).get_current_revision()
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot use database {redact(db.url)}: {exc.orig or exc}") from exc


def _sqlite_exists(db: Database) -> bool:
    """A missing SQLite file is "no schema yet"; reading must not create it."""
    path = db.engine.url.database
    return not path or path == ":memory:" or Path(path).exists()


def upgrade(db: Database, revision: str = "head") -> None:
    """Upgrade the schema (idempotent); SchemaTooNew if the database is ahead of this code."""
    cfg = _config()
    with _connect(db) as conn, conn.begin():
        refuse_newer(MigrationContext.configure(conn).get_current_revision())
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def _connect(db: Database) -> Connection:
    """A connection, or DatabaseUnavailable naming the database (SQLite: an unopenable file)."""
    try:
        return db.engine.connect()
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot use database {redact(db.url)}: {exc.orig or exc}") from exc


def drift(db: Database) -> list[str]:
    """Return the differences between the database schema and the code's tables (empty = none)."""
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": False})
        return [str(d) for d in compare_metadata(ctx, metadata)]


def make_revision(db: Database, message: str) -> None:
    """Autogenerate a new revision against `db` (for developers changing tables.py)."""
    cfg = _config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.revision(cfg, message=message, autogenerate=True)
