"""The PostgreSQL roles docs/operations.md documents are enough: a migration role that owns the
database builds the schema, and a runtime role with only the documented grants runs treadle."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from tests.conftest import _admin, _mysql_admin, _mysql_create, _mysql_drop, _mysql_url, _pg_url
from treadle import dag, task
from treadle.engine import queries
from treadle.engine.execution import claim_task_instances, complete_attempts
from treadle.store import migrate
from treadle.store.database import Database
from treadle.testing import DagRunner


@task
def answer() -> int:
    return 42


@dag(dag_id="granted")
def granted() -> None:
    answer()


#: The runtime role's grants, word for word as docs/operations.md gives them (names substituted).
RUNTIME_GRANTS = """
GRANT CONNECT ON DATABASE {db} TO {app};
GRANT USAGE ON SCHEMA public TO {app};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {app};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {app};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {app};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO {app};
"""


@pytest.fixture
def roles(pg_template: str) -> Iterator[tuple[str, str, str]]:
    """A database owned by a fresh migration role, and a runtime role; (db, owner, app)."""
    tag = uuid.uuid4().hex[:10]
    db, owner, app = f"r_{tag}", f"treadle_owner_{tag}", f"treadle_app_{tag}"
    with _admin() as conn:
        conn.execute(f"CREATE ROLE {owner} LOGIN")
        conn.execute(f"CREATE ROLE {app} LOGIN")
        conn.execute(f"CREATE DATABASE {db} OWNER {owner}")
        conn.execute(f"REVOKE ALL ON DATABASE {db} FROM PUBLIC")
    yield db, owner, app
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        conn.execute(f"DROP ROLE IF EXISTS {app}")
        conn.execute(f"DROP ROLE IF EXISTS {owner}")


def _as(role: str, db: str) -> str:
    return _pg_url(db).replace("postgres@", f"{role}@", 1)


@pytest.mark.postgres
def test_runtime_role_with_the_documented_grants_triggers_claims_and_completes(
    roles: tuple[str, str, str],
) -> None:
    db_name, owner, app = roles
    as_owner = Database(_as(owner, db_name))
    migrate.upgrade(as_owner)  # the migration role owns what it creates
    with as_owner.begin() as conn:
        for statement in RUNTIME_GRANTS.format(db=db_name, owner=owner, app=app).split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    as_owner.dispose()

    _trigger_claim_complete(_as(app, db_name))

    with psycopg.connect(_as(app, db_name), autocommit=True) as conn:
        owners = conn.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    assert owners == [(owner,)]


def _trigger_claim_complete(url: str) -> None:
    """Trigger a run, claim and complete its task, read it back; then try to change the schema."""
    runner = DagRunner(granted, database_url=url)
    try:
        run_id = runner.trigger()
        db = runner.db
        claimed = claim_task_instances(
            db, worker_id="w", hostname="h", queues=["default"], limit=5, lease_s=60
        )
        assert [t.task_id for t in claimed] == ["answer"]
        complete_attempts(db, [(t, 42) for t in claimed], worker_id="w", hostname="h")
        detail = queries.run_detail(db, run_id)
        assert [(t.task_id, t.state) for t in detail.task_instances] == [("answer", "success")]
        assert list(detail.results) == ["answer"]
        # Least privilege: the runtime role cannot change the schema.
        with (
            pytest.raises(sa.exc.DBAPIError, match=r"(?i)permission denied|command denied"),
            db.begin() as conn,
        ):
            conn.exec_driver_sql("CREATE TABLE intruder (id integer)")
    finally:
        runner.db.dispose()


#: The MariaDB grants of docs/operations.md, word for word (names substituted).
MARIADB_GRANTS = """
CREATE USER '{owner}'@'%' IDENTIFIED BY 'owner-pw';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX, REFERENCES
    ON {db}.* TO '{owner}'@'%';
CREATE USER '{app}'@'%' IDENTIFIED BY 'app-pw';
GRANT SELECT, INSERT, UPDATE, DELETE ON {db}.* TO '{app}'@'%';
"""


@pytest.mark.mysql
def test_mariadb_users_with_the_documented_grants_migrate_and_run(mysql_template: str) -> None:
    tag = uuid.uuid4().hex[:8]
    db_name, owner, app = f"r_{tag}", f"tr_own_{tag}", f"tr_app_{tag}"
    _mysql_create(db_name)
    try:
        with _mysql_admin() as conn, conn.cursor() as cur:
            for statement in MARIADB_GRANTS.format(db=db_name, owner=owner, app=app).split(";"):
                if statement.strip():
                    cur.execute(statement)
        base = sa.engine.make_url(_mysql_url(db_name))
        as_owner = Database(
            base.set(username=owner, password="owner-pw").render_as_string(hide_password=False)
        )
        migrate.upgrade(as_owner)
        as_owner.dispose()
        _trigger_claim_complete(
            base.set(username=app, password="app-pw").render_as_string(hide_password=False)
        )
    finally:
        _mysql_drop(db_name)
        with _mysql_admin() as conn, conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{owner}'@'%', '{app}'@'%'")
