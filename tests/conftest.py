"""Database fixtures: a fresh SQLite file or a fresh PostgreSQL database per test.

PostgreSQL comes from TREADLE_TEST_PG_URL (default: the machine's server, database `test`).
Each test gets `CREATE DATABASE ... TEMPLATE treadle_template`, migrated once per session.
A missing server skips those tests locally and fails them when CI is set.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from treadle.store import migrate
from treadle.store.database import Database

PG_ADMIN_URL = os.environ.get("TREADLE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TEMPLATE = "treadle_template"


def _pg_url(dbname: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{dbname}"


def _admin() -> psycopg.Connection:
    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)


@pytest.fixture(scope="session")
def pg_template() -> str:
    """Create (once per session) a migrated template database; returns its name."""
    try:
        conn = _admin()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(f"PostgreSQL not available: {exc}")
    with conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    db = Database(_pg_url(TEMPLATE))
    migrate.upgrade(db)
    db.dispose()
    return TEMPLATE


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {pg_template}")
    yield _pg_url(name)
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema) on each dialect, for migration tests."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    request.getfixturevalue("pg_template")  # skips or fails like the other PostgreSQL tests
    name = f"e_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield _pg_url(name)
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, copied for each test."""
    path = tmp_path_factory.mktemp("template") / "template.db"
    db = Database(f"sqlite:///{path}")
    migrate.upgrade(db)
    db.engine.dispose()
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh, migrated SQLite file for one test."""
    target = tmp_path / "treadle.db"
    shutil.copy(sqlite_template, target)
    return f"sqlite:///{target}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """The same test on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        url: str = request.getfixturevalue("sqlite_url")
    else:
        url = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    """A Database on a fresh schema, disposed after the test."""
    database = Database(db_url)
    yield database
    database.dispose()
