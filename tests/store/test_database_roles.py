"""The PostgreSQL roles docs/operations.md documents are enough: a migration role that owns the
database builds the schema, and a runtime role with only the documented grants runs treadle."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from tests.conftest import _admin, _pg_url
from treadle import dag, task
from treadle.engine import queries
from treadle.engine.execution import claim_task_instances, complete_attempts
from treadle.store import migrate
from treadle.store.database import Database
from treadle.testing import DagRunner

pytestmark = pytest.mark.postgres


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

    runner = DagRunner(granted, database_url=_as(app, db_name))
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
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"), db.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE intruder (id integer)")
    finally:
        runner.db.dispose()

    with psycopg.connect(_as(app, db_name), autocommit=True) as conn:
        owners = conn.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    assert owners == [(owner,)]
