"""Schema migrations with Alembic: upgrade to head, check for drift (revisions.py reads the revision)."""

from __future__ import annotations

import io
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from treadle.errors import DatabaseUnavailable
from treadle.store.database import Database, redact
from treadle.store.revisions import current_revision, head_revision, known_revisions, refuse_newer
from treadle.store.tables import metadata

__all__ = [
    "current_revision",
    "drift",
    "head_revision",
    "known_revisions",
    "make_revision",
    "refuse_newer",
    "upgrade",
    "upgrade_sql",
]

_SCRIPTS = str(Path(__file__).parent / "migrations")


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", _SCRIPTS)
    return cfg


def upgrade(db: Database, revision: str = "head") -> None:
    """Upgrade the schema (idempotent); SchemaTooNew if the database is ahead of this code."""
    cfg = _config()
    with _connect(db) as conn, conn.begin():
        refuse_newer(MigrationContext.configure(conn).get_current_revision())
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def upgrade_sql(dialect_name: str, from_revision: str | None) -> str:
    """The DDL that upgrades a database of `dialect_name` from `from_revision` (None: empty) to
    head, rendered by Alembic's offline mode without touching any database ("" if at head)."""
    known = known_revisions()
    if from_revision is not None and from_revision not in known:
        raise ValueError(f"unknown schema revision {from_revision!r}: this treadle knows {', '.join(known)}")
    if from_revision == head_revision():
        return ""
    out = io.StringIO()
    cfg = _config()
    cfg.attributes["dialect_name"] = dialect_name
    cfg.attributes["output"] = out
    command.upgrade(cfg, f"{from_revision}:head" if from_revision else "head", sql=True)
    return out.getvalue()


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
