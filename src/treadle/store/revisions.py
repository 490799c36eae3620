"""Schema revisions without Alembic: the chain's names come from the migration file names.

Every command that reads the database first checks its schema is at head. Importing Alembic
for that costs more CPU than the command itself, so this module answers the two questions
cheaply: which revisions the code knows (each file in migrations/versions is named
`NNNN_description.py` and defines revision "NNNN"; a test holds the two in step) and which
revision a database is at (one SELECT on Alembic's `alembic_version` table).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import sqlalchemy as sa

from treadle.errors import DatabaseUnavailable, SchemaOutOfDate, SchemaTooNew
from treadle.store.database import Database, redact

_VERSIONS = Path(__file__).parent / "migrations" / "versions"
#: The table Alembic records the applied revision in.
VERSION_TABLE = "alembic_version"


@cache
def known_revisions() -> tuple[str, ...]:
    """Every revision this code's migrations define, oldest first (the chain is linear)."""
    names = sorted(p.name.partition("_")[0] for p in _VERSIONS.glob("[0-9]*_*.py"))
    if not names:
        raise RuntimeError(f"no migration files in {_VERSIONS}")
    return tuple(names)


def head_revision() -> str:
    """The newest revision this code knows."""
    return known_revisions()[-1]


def refuse_newer(current: str | None) -> None:
    """Raise SchemaTooNew if the database is at a revision this code does not know.

    The chain is linear, so a revision we know is head or older; one we do not know was written
    by a newer treadle (or one from another branch), and no downgrade path from it exists here.
    """
    if current is not None and current not in known_revisions():
        raise SchemaTooNew(revision=current, expected=head_revision())


def current_revision(db: Database) -> str | None:
    """The revision the database is at (None if never migrated; a missing SQLite file is not made)."""
    if db.is_sqlite and not _sqlite_exists(db):
        return None
    try:
        with db.engine.connect() as raw:
            conn = raw.execution_options(treadle_readonly=True)
            if not sa.inspect(conn).has_table(VERSION_TABLE):
                return None
            rows = conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalars().all()
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot use database {redact(db.url)}: {exc.orig or exc}") from exc
    if len(rows) > 1:
        raise SchemaOutOfDate(
            f"database records several schema revisions ({', '.join(sorted(rows))}); "
            f"this treadle expects one chain ending at {head_revision()}"
        )
    return rows[0] if rows else None


def _sqlite_exists(db: Database) -> bool:
    """A missing SQLite file is "no schema yet"; reading must not create it."""
    path = db.engine.url.database
    return not path or path == ":memory:" or Path(path).exists()
