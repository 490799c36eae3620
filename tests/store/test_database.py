"""Connection details: URL forms, which errors are retried, session settings per dialect."""

from __future__ import annotations

import socket
from dataclasses import replace
from datetime import timedelta

import pymysql
import pytest
import sqlalchemy as sa

from treadle import dag, task
from treadle.errors import ConfigError
from treadle.store import dialects
from treadle.store import runs as run_store
from treadle.store.database import IDLE_IN_TRANSACTION_S, Database, is_transient, normalise_url
from treadle.testing import DagRunner


@task
def noop() -> None:
    return None


@dag(dag_id="tiny")
def tiny() -> None:
    noop()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("mysql://u:p@h:3306/db", "mysql+pymysql://u:p@h:3306/db"),
        ("mariadb://u@h/db", "mysql+pymysql://u@h/db"),
        ("mysql+pymysql://u@h/db", "mysql+pymysql://u@h/db"),
        ("mariadb+pymysql://u@h/db", "mysql+pymysql://u@h/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_urls_are_normalised_to_the_bundled_drivers(url: str, expected: str) -> None:
    assert normalise_url(url) == expected


@pytest.mark.parametrize("url", ["postgresqlx://u@h/db", "mysqlx://u@h/db", "http://h/db"])
def test_unknown_schemes_are_a_config_error_not_a_driver_error(url: str) -> None:
    with pytest.raises(ConfigError, match=r"unsupported scheme .*; supported: sqlite:///PATH, postgresql://"):
        Database(url)


@pytest.mark.parametrize(
    ("code", "transient"), [(1213, True), (1205, True), (2013, True), (2003, True), (1062, False)]
)
def test_mysql_deadlocks_and_lost_connections_are_transient(code: int, transient: bool) -> None:
    error = sa.exc.OperationalError("UPDATE ...", {}, pymysql.err.OperationalError(code, "message"))
    assert is_transient(error) is transient


def test_a_mysql_connect_that_times_out_is_transient() -> None:
    """A server too stalled to accept (its accept queue full) times the connect out: retried,
    as PostgreSQL's "connection timeout expired" is, not only a refused connect."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: the queue fills, further connects get no answer
        port = listener.getsockname()[1]
        queued = []
        for _ in range(3):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            queued.append(s)
        try:
            with pytest.raises(pymysql.err.OperationalError) as caught:
                pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=1)
        finally:
            for s in queued:
                s.close()
    assert "timed out" in str(caught.value)
    assert is_transient(sa.exc.OperationalError(None, None, caught.value))


@pytest.mark.mysql
def test_mysql_sessions_are_utc_strict_and_read_committed(mysql_url: str) -> None:
    db = Database(mysql_url)
    with db.read() as conn:
        zone, mode = conn.exec_driver_sql("SELECT @@time_zone, @@sql_mode").one()
        isolation = conn.get_isolation_level()
    db.dispose()
    assert (zone, isolation) == ("+00:00", "READ COMMITTED")
    assert "STRICT_TRANS_TABLES" in mode.split(",")


@pytest.mark.parametrize(
    ("fixture", "query", "per_second"),
    [
        pytest.param(
            "pg_url",
            "SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'",
            1000,  # milliseconds
            marks=pytest.mark.postgres,
        ),
        pytest.param("mysql_url", "SELECT @@idle_transaction_timeout", 1, marks=pytest.mark.mysql),
    ],
)
def test_the_server_ends_a_transaction_its_client_left_idle(
    request: pytest.FixtureRequest, fixture: str, query: str, per_second: int
) -> None:
    """A client cut off mid-transaction must not hold its row locks for hours (F13): a lost
    attempt's row stays locked, and no reaper could end the attempt, until the server ends it."""
    db = Database(request.getfixturevalue(fixture))
    with db.read() as conn:
        value = int(conn.exec_driver_sql(query).scalar_one())
    db.dispose()
    assert value == IDLE_IN_TRANSACTION_S * per_second


@pytest.mark.postgres
def test_planning_each_statement_holds_for_one_transaction_only(pg_url: str) -> None:
    """A batch transaction (`dags sync`) plans each statement for its parameters; the pooled
    connection then serves the hot path with PostgreSQL's cached plans again."""
    db = Database(pg_url, pool_size=1)
    try:
        with db.begin() as conn:
            dialects.plan_each_statement(conn)
            inside = conn.exec_driver_sql("SHOW plan_cache_mode").scalar_one()
        with db.read() as conn:
            after = conn.exec_driver_sql("SHOW plan_cache_mode").scalar_one()
    finally:
        db.dispose()
    assert (inside, after) == ("force_custom_plan", "auto")


@pytest.mark.postgres
def test_a_postgresql_read_opens_no_transaction_and_writes_still_do(pg_url: str) -> None:
    """A read costs one round trip per statement (autocommit: no BEGIN, no COMMIT); the pooled
    connection goes back to transactions for the next write."""
    db = Database(pg_url, pool_size=1)
    same_clock = "SELECT now() = statement_timestamp()"  # true only for a transaction's first statement
    try:
        with db.read() as conn:
            conn.exec_driver_sql("SELECT pg_sleep(0.01)")
            read_is_one_statement = conn.exec_driver_sql(same_clock).scalar_one()
        with db.begin() as conn:
            conn.exec_driver_sql("SELECT pg_sleep(0.01)")
            write_is_one_statement = conn.exec_driver_sql(same_clock).scalar_one()
        assert db.query(lambda conn: conn.exec_driver_sql("SELECT 1").scalar_one()) == 1
    finally:
        db.dispose()
    assert (read_is_one_statement, write_is_one_statement) == (True, False)


def test_a_conflicting_batch_insert_is_a_conflict_the_transaction_retries(db_url: str) -> None:
    """The pipelined batch insert (store/dialects.py insert_many) fails as SQLAlchemy's own
    statements fail: two manual triggers in one clock tick then retry instead of answering 500."""
    runner = DagRunner(tiny, database_url=db_url)
    try:
        run_id = runner.trigger()
        run = runner.db.query(lambda conn: run_store.get_run(conn, run_id))
        assert run is not None
        calls: list[int] = []

        def insert(conn: sa.Connection) -> str:
            calls.append(1)
            again = (
                run
                if len(calls) == 1
                else replace(
                    run, run_id=f"{run.run_id}-2", logical_date=run.logical_date + timedelta(microseconds=1)
                )
            )
            run_store.insert_run(conn, again)  # the first time: the same keys as the stored run
            return again.run_id

        assert runner.db.transact(insert, retry_conflicts=True) == f"{run.run_id}-2"
        assert len(calls) == 2
        with pytest.raises(sa.exc.IntegrityError):
            runner.db.transact(lambda conn: run_store.insert_run(conn, run))
    finally:
        runner.close()
