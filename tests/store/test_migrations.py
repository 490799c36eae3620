"""Migrations: the chain builds exactly the tables the code declares, on every dialect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from treadle.store import migrate
from treadle.store.database import Database


def test_migrated_schema_matches_tables(db: Database) -> None:
    assert migrate.current_revision(db) == migrate.head_revision()
    assert migrate.drift(db) == []


def test_upgrade_is_idempotent(db: Database) -> None:
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.head_revision()


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'wal.db'}")
    migrate.upgrade(db)
    with db.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    db.dispose()


def _cli(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    env = {"TREADLE_DATABASE_URL": url, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "treadle.cli", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_db_check_and_upgrade_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    before = _cli(["db", "check"], url)
    assert before.returncode == 3
    assert "expects" in before.stderr
    assert not (tmp_path / "fresh.db").exists()  # checking never creates a database

    upgraded = _cli(["db", "upgrade"], url)
    assert upgraded.returncode == 0, upgraded.stderr
    after = _cli(["db", "check"], url)
    assert after.returncode == 0, after.stderr
    assert "no drift" in after.stdout
