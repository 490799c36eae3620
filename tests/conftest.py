"""Database fixtures: a fresh SQLite file, PostgreSQL database or MariaDB database per test.

PostgreSQL comes from TREADLE_TEST_PG_URL (default: the machine's server, database `test`).
Each test gets `CREATE DATABASE ... TEMPLATE treadle_template_<pid>`, migrated once per session.
MariaDB/MySQL comes from TREADLE_TEST_MYSQL_URL; it has no template databases, so each test
gets a new database whose tables are copied (`CREATE TABLE ... LIKE`) from one migrated once.
A missing server skips those tests locally and fails them when CI is set. The drivers are
imported only by the fixtures that use them, so SQLite tests run on a SQLite-only install too
(.ci/wheel-matrix).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from treadle.store import migrate
from treadle.store.database import Database

if TYPE_CHECKING:
    import psycopg
    import pymysql

PG_ADMIN_URL = os.environ.get("TREADLE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
#: Per test session, so sessions running side by side never drop each other's template.
TEMPLATE = f"treadle_template_{os.getpid()}"
MYSQL_ADMIN_URL = os.environ.get("TREADLE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


def _pg_url(dbname: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{dbname}"


def _admin() -> psycopg.Connection:
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """Create (once per session) a migrated template database; yields its name."""
    import psycopg

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
    yield TEMPLATE
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {pg_template}")
    yield _pg_url(name)
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _mysql_url(dbname: str) -> str:
    return sa.engine.make_url(MYSQL_ADMIN_URL).set(database=dbname).render_as_string(hide_password=False)


def _mysql_admin() -> pymysql.connections.Connection[Any]:
    import pymysql

    url = sa.engine.make_url(MYSQL_ADMIN_URL)
    return pymysql.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        database=url.database,
        autocommit=True,
        connect_timeout=5,
    )


def _mysql_create(name: str) -> None:
    with _mysql_admin() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")  # server defaults, as a user would create it


def _mysql_drop(name: str) -> None:
    with _mysql_admin() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture(scope="session")
def mysql_template() -> Iterator[str]:
    """Create (once per session) a migrated MariaDB/MySQL database to copy tables from."""
    import pymysql

    try:
        _mysql_admin().close()
    except pymysql.err.OperationalError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"MariaDB/MySQL is required in CI: {exc}")
        pytest.skip(f"MariaDB/MySQL not available: {exc}")
    _mysql_drop(TEMPLATE)
    _mysql_create(TEMPLATE)
    db = Database(_mysql_url(TEMPLATE))
    migrate.upgrade(db)
    db.dispose()
    yield TEMPLATE
    _mysql_drop(TEMPLATE)


@pytest.fixture
def mysql_url(mysql_template: str) -> Iterator[str]:
    """A fresh, migrated MariaDB/MySQL database for one test (tables copied from the template)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    _mysql_create(name)
    with _mysql_admin() as conn, conn.cursor() as cur:
        cur.execute(f"SHOW TABLES FROM {mysql_template}")
        for (table,) in cur.fetchall():
            cur.execute(f"CREATE TABLE {name}.{table} LIKE {mysql_template}.{table}")
        cur.execute(f"INSERT INTO {name}.alembic_version SELECT * FROM {mysql_template}.alembic_version")
    yield _mysql_url(name)
    _mysql_drop(name)


#: Fixtures that need a server, and the marker a test asking for one carries.
_SERVER_FIXTURES = {
    "pg_template": "postgres",
    "pg_url": "postgres",
    "mysql_template": "mysql",
    "mysql_url": "mysql",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark a test that uses a server's database even where its file forgot to, before `-m`
    selects: `-m "not postgres and not mysql"` must run no test against a server."""
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            marker = _SERVER_FIXTURES.get(fixture)
            if marker is not None and item.get_closest_marker(marker) is None:
                item.add_marker(marker)


_DIALECTS = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


@pytest.fixture(params=_DIALECTS)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema) on each dialect, for migration tests."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    if request.param == "mysql":
        request.getfixturevalue("mysql_template")  # skips or fails like the other MySQL tests
        name = f"e_{uuid.uuid4().hex[:12]}"
        _mysql_create(name)
        yield _mysql_url(name)
        _mysql_drop(name)
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


@pytest.fixture(params=_DIALECTS)
def db_url(request: pytest.FixtureRequest) -> str:
    """The same test on SQLite, PostgreSQL and MariaDB/MySQL."""
    fixture = {"sqlite": "sqlite_url", "postgresql": "pg_url", "mysql": "mysql_url"}[request.param]
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    """A Database on a fresh schema, disposed after the test."""
    database = Database(db_url)
    yield database
    database.dispose()
