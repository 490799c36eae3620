"""Migrations: the chain builds exactly the tables the code declares, on every dialect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from treadle.cli.main import cli
from treadle.errors import SchemaTooNew
from treadle.store import migrate
from treadle.store.database import Database


def test_migrated_schema_matches_tables(db: Database) -> None:
    assert migrate.current_revision(db) == migrate.head_revision()
    assert migrate.drift(db) == []


def test_upgrade_is_idempotent(db: Database) -> None:
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.head_revision()


def test_a_database_ahead_of_the_code_is_refused_not_downgraded(db: Database) -> None:
    with db.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    head = migrate.head_revision()
    expected = (
        f"database is at revision 9999, newer than this treadle (expects {head}): "
        "upgrade treadle, do not downgrade the database"
    )
    with pytest.raises(SchemaTooNew) as info:
        migrate.upgrade(db)
    assert (str(info.value), info.value.revision, info.value.expected) == (expected, "9999", head)
    assert migrate.current_revision(db) == "9999"
    with pytest.raises(SchemaTooNew):
        migrate.refuse_newer(migrate.current_revision(db))
    migrate.refuse_newer(head)
    migrate.refuse_newer(None)


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'wal.db'}")
    migrate.upgrade(db)
    with db.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    db.dispose()


def _cli(args: list[str], url: str, home: Path) -> Result:
    """`treadle ARGS` in this process: the commands' output and exit codes, no process start."""
    return CliRunner().invoke(cli, args, env={"TREADLE_DATABASE_URL": url, "TREADLE_HOME": str(home)})


def test_db_check_and_upgrade_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    home = tmp_path / "home"
    before = _cli(["db", "check"], url, home)
    assert before.exit_code == 3
    assert "expects" in before.stderr
    assert not (tmp_path / "fresh.db").exists()  # checking never creates a database

    upgraded = _cli(["db", "upgrade"], url, home)
    assert upgraded.exit_code == 0, upgraded.output
    after = _cli(["db", "check"], url, home)
    assert after.exit_code == 0, after.output
    assert "no drift" in after.stdout


def test_upgrade_gives_old_rows_their_deadlines(empty_db_url: str) -> None:
    import sqlalchemy as sa

    from treadle.store.tables import task_instances as ti

    db = Database(empty_db_url)
    migrate.upgrade(db, "0001")
    started = "2026-01-01 10:00:00"
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO task_instances (run_id, dag_id, task_id, map_index, state, attempt,"
                " budget_base, orphaned_count, queue, priority_weight, upstream_total, upstream_done,"
                " started_at, timeout_s, queued_at)"
                " VALUES ('r', 'd', :task, -1, :state, 1, 0, 0, 'default', 1, 0, 0, :at, 30, :at)"
            ),
            [
                {"task": "running_one", "state": "running", "at": started},
                {"task": "queued_one", "state": "queued", "at": started},
            ],
        )
    migrate.upgrade(db)
    with db.read() as conn:
        rows = {
            r.task_id: r
            for r in conn.execute(sa.select(ti.c.task_id, ti.c.timeout_at, ti.c.dispatch_deadline))
        }
    assert rows["running_one"].timeout_at.isoformat() == "2026-01-01T10:00:30+00:00"
    assert rows["queued_one"].dispatch_deadline.isoformat() == "2026-01-01T10:10:00+00:00"
    assert migrate.drift(db) == []
    db.dispose()


def test_revisions_read_from_file_names_are_alembics_chain() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from treadle.store import revisions

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrate.__file__).parent / "migrations"))
    script = ScriptDirectory.from_config(cfg)
    chain = [rev.revision for rev in script.walk_revisions()][::-1]
    assert list(revisions.known_revisions()) == chain
    assert revisions.head_revision() == script.get_current_head()


def test_a_database_recording_two_revisions_is_refused(db: Database) -> None:
    from treadle.errors import SchemaOutOfDate

    with db.begin() as conn:
        conn.exec_driver_sql("INSERT INTO alembic_version (version_num) VALUES ('0001')")
    with pytest.raises(SchemaOutOfDate, match=r"several schema revisions \(0001, "):
        migrate.current_revision(db)


def test_reading_runs_imports_no_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _cli(["db", "upgrade"], url, tmp_path / "home").exit_code == 0
    probe = (
        "import sys\n"
        "from treadle.cli.main import main\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print(sorted(m for m in ('alembic', 'rich', 'jsonschema', 'fastapi', 'psycopg',"
        " 'sqlalchemy.dialects.postgresql', 'sqlalchemy.dialects.mysql') if m in sys.modules),"
        " file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "runs", "list", "--json"],
        env={"TREADLE_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert done.stderr.strip().splitlines()[-1] == "[]"


def test_dialect_only_options_reach_the_ddl_of_their_dialect(db: Database) -> None:
    """Attached when a database of the dialect opens (`tables.bind_dialect`), not at import: the
    claim index is partial where the dialect allows, MariaDB tables compare ids byte for byte,
    JSON is JSONB on PostgreSQL."""
    from sqlalchemy.schema import CreateIndex, CreateTable

    from treadle.store import tables

    dialect = db.engine.dialect
    claim = next(i for i in tables.task_instances.indexes if i.name == "ix_task_instances_claim_order")
    index_ddl = str(CreateIndex(claim).compile(dialect=dialect))
    runs_ddl = str(CreateTable(tables.dag_runs).compile(dialect=dialect))
    if db.dialect == "mysql":
        assert "WHERE" not in index_ddl
        assert "utf8mb4_bin" in runs_ddl
    else:
        assert "WHERE" in index_ddl and "queued" in index_ddl, index_ddl
        assert "utf8mb4" not in runs_ddl
    assert ("JSONB" in runs_ddl) == (db.dialect == "postgresql"), runs_ddl


def test_a_process_log_names_each_revision_applied_and_no_alembic_chatter(tmp_path: Path) -> None:
    """A process that logs (standalone, scheduler, worker) and migrates at start: a new database
    is one line, an upgrade one treadle line per revision applied, an up-to-date schema nothing,
    and none of Alembic's INFO lines at any time."""
    import json

    chain = list(migrate.known_revisions())
    middle = chain[2]
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    probe = (
        "import sys\n"
        "from treadle.observability.logging import configure_logging\n"
        "from treadle.store import migrate\n"
        "from treadle.store.database import Database\n"
        "configure_logging('INFO', log_format='json')\n"
        "db = Database(sys.argv[1])\n"
        "migrate.upgrade(db, sys.argv[2])\n"
        "print('---', file=sys.stderr, flush=True)\n"
        "migrate.upgrade(db)\n"
        "print('---', file=sys.stderr, flush=True)\n"
        "migrate.upgrade(db)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, url, middle], text=True, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    created, upgraded, again = (
        [json.loads(x) for x in part.splitlines()] for part in done.stderr.split("---\n")
    )
    assert {line["logger"] for line in created + upgraded} == {"treadle.store.migrate"}
    assert [line["event"] for line in created + upgraded] == ["db.migrated"] * (1 + len(chain) - 3)
    (new,) = created
    assert new["message"] == f"schema created at {middle} (3 revisions)"
    assert (new["revision"], new["from_revision"], new["revisions"]) == (middle, None, 3)
    assert [line["revision"] for line in upgraded] == chain[3:]
    assert [line["from_revision"] for line in upgraded] == chain[2:-1]
    assert upgraded[0]["message"].startswith(f"schema upgraded to {chain[3]}: ")
    assert again == []
