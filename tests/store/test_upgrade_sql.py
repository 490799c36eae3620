"""`treadle db upgrade --sql`: the DDL a DBA reviews and applies builds the schema `db upgrade` builds."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from tests.conftest import _admin, _pg_url
from treadle.cli.main import cli
from treadle.store import migrate
from treadle.store.database import Database


def _cli(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "treadle.cli", *args],
        env={"TREADLE_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )


def _columns(url: str) -> dict[str, list[str]]:
    """Table name -> sorted column names, as the database reports them."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        inspector = sa.inspect(engine)
        return {t: sorted(c["name"] for c in inspector.get_columns(t)) for t in inspector.get_table_names()}
    finally:
        engine.dispose()


@pytest.fixture
def empty_pg() -> Iterator[list[str]]:
    """Names for empty PostgreSQL databases made by the test; dropped afterwards."""
    names: list[str] = []
    yield names
    with _admin() as conn:
        for name in names:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _create_pg(names: list[str]) -> str:
    name = f"s_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f"CREATE DATABASE {name}")
    names.append(name)
    return _pg_url(name)


def test_sql_for_a_fresh_sqlite_file_creates_every_table_and_touches_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    printed = _cli(["db", "upgrade", "--sql"], url)
    assert printed.returncode == 0, printed.stderr
    assert not (tmp_path / "fresh.db").exists()  # offline: no database opened or made
    assert "CREATE TABLE dag_runs (" in printed.stdout
    assert "CREATE TABLE alembic_version (" in printed.stdout
    assert f"UPDATE alembic_version SET version_num='{migrate.head_revision()}'" in printed.stdout

    applied = tmp_path / "applied.db"
    with sqlite3.connect(applied) as conn:
        conn.executescript(printed.stdout)
    upgraded = Database(f"sqlite:///{tmp_path / 'upgraded.db'}")
    migrate.upgrade(upgraded)
    upgraded.dispose()
    assert _columns(f"sqlite:///{applied}") == _columns(upgraded.url)


@pytest.mark.postgres
def test_sql_applied_with_psql_gives_the_schema_db_upgrade_gives(
    pg_template: str, empty_pg: list[str]
) -> None:
    by_psql = _create_pg(empty_pg)
    printed = _cli(["db", "upgrade", "--sql"], by_psql)
    assert printed.returncode == 0, printed.stderr
    assert "CREATE TABLE task_instances (" in printed.stdout
    assert "JSONB" in printed.stdout  # rendered for PostgreSQL, not generically
    applied = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", by_psql],
        input=printed.stdout,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr

    by_treadle = _create_pg(empty_pg)
    upgraded = _cli(["db", "upgrade"], by_treadle)
    assert upgraded.returncode == 0, upgraded.stderr
    expected = _columns(by_treadle)
    assert len(expected) > 20
    assert _columns(by_psql) == expected

    checked = _cli(["db", "check"], by_psql)
    assert checked.returncode == 0, checked.stderr
    assert "no drift" in checked.stdout
    at_head = _cli(["db", "upgrade", "--sql"], by_psql)
    assert at_head.returncode == 0, at_head.stderr
    assert at_head.stdout == f"-- database already at revision {migrate.head_revision()}: nothing to apply\n"


def test_sql_from_a_revision_prints_only_the_later_steps(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'any.db'}"
    revisions = migrate.known_revisions()
    printed = _cli(["db", "upgrade", "--sql", "--from", revisions[-2]], url)
    assert printed.returncode == 0, printed.stderr
    assert f"-- Running upgrade {revisions[-2]} -> {revisions[-1]}" in printed.stdout
    assert f"-- Running upgrade {revisions[-3]} -> {revisions[-2]}" not in printed.stdout
    assert "CREATE TABLE alembic_version" not in printed.stdout

    # Refused options, checked in this process: no process start each.
    env = {"TREADLE_DATABASE_URL": url}
    unknown = CliRunner().invoke(cli, ["db", "upgrade", "--sql", "--from", "0008"], env=env)
    assert unknown.exit_code != 0
    assert "unknown revision '0008'" in unknown.stderr
    assert revisions[0] in unknown.stderr

    without_sql = CliRunner().invoke(cli, ["db", "upgrade", "--from", "0001"], env=env)
    assert without_sql.exit_code != 0
    assert "--from only applies with --sql" in without_sql.stderr
    assert not (tmp_path / "any.db").exists()
