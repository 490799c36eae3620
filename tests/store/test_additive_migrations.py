"""Processes of the previous version keep running on an upgraded schema (docs/operations.md,
"Restart, one process at a time"): every migration only adds what old code can ignore.

Old code reads and writes the columns it knows. It keeps working while the schema gains tables,
indexes, nullable columns and columns with a server default, and while a migration fills new
columns of existing rows. It breaks if a table or column it uses is dropped, renamed or retyped,
if an existing column becomes NOT NULL, or if a new column is NOT NULL without a default (its
inserts do not name it). The DDL each migration renders for PostgreSQL and MariaDB (Alembic's
offline mode, as `treadle db upgrade --sql` prints it) is checked statement by statement.

A migration that must break this goes into BREAKING with the reason its release note gives
operators (stop every process of the old version before upgrading).
"""

from __future__ import annotations

import re

import pytest

from treadle.store import migrate

#: Revision -> why old processes must be stopped before it is applied (none so far).
BREAKING: dict[str, str] = {}

#: Statements old code can ignore (matched against whitespace-normalised, upper-cased DDL).
_ALLOWED = [
    re.compile(p)
    for p in (
        r"^BEGIN$",
        r"^COMMIT$",
        r"^CREATE TABLE ",
        r"^CREATE (UNIQUE )?INDEX ",
        r"^DROP INDEX ",
        r"^UPDATE ",
        r"^INSERT INTO ",
        r"^COMMENT ON ",
        # A new column: nullable, or NOT NULL with a default (checked below).
        r"^ALTER TABLE \S+ ADD COLUMN ",
        r"^ALTER TABLE \S+ ADD CONSTRAINT \S+ FOREIGN KEY\(",
    )
]


def breaking_statements(sql: str) -> list[tuple[str, str]]:
    """(revision, statement) for each statement of an upgrade script that old code may trip on."""
    found: list[tuple[str, str]] = []
    revision = "?"
    for raw in re.split(r";\s*\n", sql):
        lines = []
        for line in raw.splitlines():
            heading = re.match(r"-- Running upgrade \S+ -> (\S+)", line.strip())
            if heading:
                revision = heading.group(1)
            elif not line.strip().startswith("--"):
                lines.append(line)
        statement = " ".join(" ".join(lines).split()).upper()
        if not statement or "ALEMBIC_VERSION" in statement:
            continue
        allowed = any(p.search(statement) for p in _ALLOWED)
        if allowed and re.match(r"^ALTER TABLE \S+ ADD COLUMN ", statement):
            allowed = "NOT NULL" not in statement or " DEFAULT " in statement
        if not allowed:
            found.append((revision, statement))
    return found


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_every_migration_only_adds_what_processes_of_the_old_version_can_ignore(dialect: str) -> None:
    sql = migrate.upgrade_sql(dialect, migrate.known_revisions()[0])
    assert "-- Running upgrade" in sql  # the script is the one a DBA would apply
    problems = [(rev, stmt) for rev, stmt in breaking_statements(sql) if rev not in BREAKING]
    assert not problems, (
        "a migration would break processes of the previous version during a rolling restart; "
        "make it additive, or name it in BREAKING with its release note:\n"
        + "\n".join(f"{rev}: {stmt[:200]}" for rev, stmt in problems)
    )


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE pools",
        "ALTER TABLE task_instances DROP COLUMN pool",
        "ALTER TABLE dags RENAME COLUMN owner TO owners",
        "ALTER TABLE dags RENAME TO dag_list",
        "ALTER TABLE task_instances ALTER COLUMN attempt TYPE BIGINT",
        "ALTER TABLE task_instances ALTER COLUMN pool SET NOT NULL",
        "ALTER TABLE task_instances MODIFY pool VARCHAR(100) NOT NULL",
        "ALTER TABLE task_instances CHANGE pool pool_name VARCHAR(250)",
        "ALTER TABLE task_instances ADD COLUMN weight INTEGER NOT NULL",
        "ALTER TABLE dag_runs ADD CONSTRAINT ck_state CHECK (state <> '')",
    ],
)
def test_the_check_catches_each_kind_of_breaking_change(statement: str) -> None:
    script = f"-- Running upgrade 0016 -> 0017\n\n{statement};\n\nUPDATE alembic_version SET x;\n"
    assert breaking_statements(script) == [("0017", " ".join(statement.split()).upper())]


@pytest.mark.parametrize(
    "statement",
    [
        "ALTER TABLE task_instances ADD COLUMN weight INTEGER DEFAULT '0' NOT NULL",
        "ALTER TABLE task_instances ADD COLUMN note TEXT",
        "CREATE INDEX ix_x ON task_instances (state)",
        "DROP INDEX ix_dag_runs_state",
        "UPDATE task_instances SET note = '' WHERE note IS NULL",
    ],
)
def test_the_check_lets_additive_changes_through(statement: str) -> None:
    assert breaking_statements(f"-- Running upgrade 0016 -> 0017\n\n{statement};\n") == []
