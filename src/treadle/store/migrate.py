"""Schema migrations with Alembic: upgrade to head, check for drift (revisions.py reads the revision)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
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

log = logging.getLogger(__name__)


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", _SCRIPTS)
    return cfg


def upgrade(db: Database, revision: str = "head") -> None:
    """Upgrade the schema (idempotent); SchemaTooNew if the database is ahead of this code.

    Logs `db.migrated`: one line for a new database, one per revision applied to an existing one,
    none when the schema was at `revision`. Alembic's own INFO lines, a dozen at every start, are
    left out of the process log (observability/logging.py).
    """
    cfg = _config()
    with _connect(db) as conn, conn.begin():
        before = MigrationContext.configure(conn).get_current_revision()
        refuse_newer(before)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        after = MigrationContext.configure(conn).get_current_revision()
    _log_applied(cfg, before, after)


def _log_applied(cfg: Config, before: str | None, after: str | None) -> None:
    """Log what the upgrade did: a new database in one line, an existing one a line per revision
    applied after `before` up to `after`, in order (a DBA reads what changed)."""
    if after is None or after == before:
        return
    chain = list(known_revisions())
    applied = (
        chain[: chain.index(after) + 1]
        if before is None
        else chain[chain.index(before) + 1 : chain.index(after) + 1]
    )
    if before is None:
        log.info(
            "schema created at %s (%d revisions)",
            after,
            len(applied),
            extra={
                "event": "db.migrated",
                "revision": after,
                "from_revision": None,
                "revisions": len(applied),
            },
        )
        return
    script = ScriptDirectory.from_config(cfg)
    for revision_id in applied:
        revision = script.get_revision(revision_id)
        doc = " ".join((revision.doc or "").split()) if revision is not None else ""
        log.info(
            "schema upgraded to %s: %s",
            revision_id,
            doc,
            extra={"event": "db.migrated", "revision": revision_id, "from_revision": before},
        )
        before = revision_id


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
