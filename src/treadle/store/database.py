"""Connections: engine factory per dialect, short transactions, transient-error retry, DB time."""

from __future__ import annotations

import importlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from treadle.domain.alerts import Alerting
from treadle.domain.mapping import DEFAULT_MAX_MAP_LENGTH
from treadle.domain.urls import DatabaseUrl, parse_database_url
from treadle.errors import ConfigError, DatabaseUnavailable
from treadle.store import audit, dialects, tables, wakeups

if TYPE_CHECKING:
    # Types of the caches only: a command that reads runs does not import DAG structures.
    from treadle.domain.access import Principal
    from treadle.domain.dag_version import DagVersion
    from treadle.domain.records import RunInfo

log = logging.getLogger("treadle.store")
T = TypeVar("T")

#: Errors that mean "try again": lost connections, lock timeouts, SQLite busy, serialization.
_TRANSIENT_SQLSTATES = {
    "40001",
    "40P01",
    "55P03",
    "57P01",
    "57P02",
    "57P03",
    "08000",
    "08003",
    "08006",
    "08001",
    "08004",
}
#: MySQL/MariaDB error numbers worth retrying: lock wait timeout, deadlock, server gone away,
#: lost connection, connection killed (MariaDB 1927), idle client disconnected (4031), and
#: cannot connect (2003: refused, or timed out when a stalled server's accept queue is full).
_TRANSIENT_MYSQL_ERRORS = {1205, 1213, 2003, 2006, 2013, 1927, 4031}


def normalise_url(url: str) -> str:
    """Map an accepted URL to its driver: PostgreSQL to psycopg 3, MySQL/MariaDB to PyMySQL.

    Schemes are matched exactly (domain/urls.py lists them); anything else, or a URL whose
    driver is not installed (psycopg comes with the `postgres` extra, PyMySQL with `mysql`), is
    a ConfigError. MariaDB URLs use SQLAlchemy's `mysql` dialect name, so one name covers both
    servers.
    """
    parsed = parse_database_url(url)
    _require_driver(parsed)
    return parsed.for_driver


def _require_driver(url: DatabaseUrl) -> None:
    """ConfigError naming the extra to install if an optional driver cannot be imported."""
    backend = url.backend
    if backend.driver_module is None:
        return
    try:
        importlib.import_module(backend.driver_module)
    except ImportError:
        raise ConfigError(
            f"{url.scheme}:// URLs need the {backend.driver_module} driver, which is not installed: "
            f'pip install "treadle[{backend.extra}]"'
        ) from None


def is_transient(exc: BaseException) -> bool:
    """Return True if a database error is worth retrying (connection loss, lock, busy)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    orig = getattr(exc, "orig", None)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _TRANSIENT_SQLSTATES:
        return True
    # PyMySQL errors carry the server's error number as their first argument.
    args = getattr(orig, "args", None)
    if args and args[0] in _TRANSIENT_MYSQL_ERRORS:
        return True
    text = str(orig or exc).lower()
    return isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError) and any(
        s in text
        for s in (
            "database is locked",
            "database is busy",
            "connection",
            "server closed",
            "terminat",
        )
    )


#: Longest any statement (or lock wait) of the default pools may take.
DEFAULT_STATEMENT_TIMEOUT_S = 60.0
#: Longest wait for SQLite's writer lock.
_SQLITE_BUSY_S = 30.0
#: Seconds to establish a connection before giving up (then retried as transient).
_CONNECT_TIMEOUT_S = 10


class Enlistment:
    """A write joining the next write transaction of the current context (`Database.enlisted`).

    `join(conn)` runs first in that transaction, and again in each retry of it; once one of its
    attempts commits, or ends with an error that is not the database's (a refusal), the
    enlistment is spent and later transactions of the context run without it.
    """

    def __init__(
        self, join: Callable[[Connection], None], finish: Callable[[Connection, Any], None] | None = None
    ) -> None:
        self.join = join
        #: Runs last in that transaction, before its commit, with the value the transaction's
        #: function returned (`Database.transact` only; a bare `begin` block has no value).
        self.finish = finish
        #: True once a transaction it joined committed or was refused.
        self.spent = False
        #: True once a transaction it joined committed (its write is in the database).
        self.committed = False


_ENLISTED: ContextVar[tuple[Enlistment, ...]] = ContextVar("treadle_enlisted", default=())
#: conn.info key: the enlistments that joined the connection's current transaction.
_JOINED = "treadle_joined"


class Database:
    """One database: the engine, write and read transactions, and the database clock."""

    def __init__(
        self,
        url: str,
        *,
        application_name: str = "treadle",
        pool_size: int = 5,
        statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
        max_map_length: int = DEFAULT_MAX_MAP_LENGTH,
    ) -> None:
        """`statement_timeout_s` bounds every statement and lock wait of this pool's connections
        (a worker's heartbeats use a pool of their own with one shorter than the lease).
        `max_map_length` is the deployment's cap on a mapped task's expansion
        (TREADLE_MAX_MAP_LENGTH), applied by whichever process expands one."""
        self.url = normalise_url(url)
        self.statement_timeout_s = statement_timeout_s
        self.engine: Engine = _create_engine(self.url, application_name, pool_size, statement_timeout_s)
        self.dialect = self.engine.dialect.name
        tables.bind_dialect(self.dialect)
        #: DAG version id -> version; versions are immutable, so this never goes stale.
        self.version_cache: dict[int, DagVersion] = {}
        #: DAG version id -> its params schema, for views that mask params without building
        #: the version (engine/versions.py params_schemas_of).
        self.params_schema_cache: dict[int, dict[str, Any] | None] = {}
        #: Run id -> run, read by claims only for fields fixed at creation (version, date, conf).
        self.run_cache: dict[str, RunInfo] = {}
        #: Token hash -> (monotonic deadline, principal): the API's short-lived token cache
        #: (engine/accounts.py fills it, and empties it on every account change it makes).
        self.principal_cache: dict[str, tuple[float, Principal]] = {}
        #: Moves on at every such change, so a principal read across one is not kept.
        self.principal_generation = 0
        self.max_map_length = max_map_length
        #: Where a SQLite database's wake-ups go (store/wakeups.py); None elsewhere.
        self.wakeups = wakeups.for_url(self.url) if self.dialect == "sqlite" else None
        #: Told the kind ("write", "read") and duration in seconds of every transact and query,
        #: retries included (a process with metrics sets it); None: nothing is timed.
        self.on_call: Callable[[str, float], None] | None = None
        #: The outbox sinks the deployment delivers to ("webhook"); effects are written to the
        #: outbox only for these (none: nothing is written).
        self.outbox_sinks: tuple[str, ...] = ()
        #: The OpenLineage namespace when lineage events are written to the outbox (a process
        #: with TREADLE_OPENLINEAGE_URL or _FILE sets it); None: no lineage events.
        self.lineage_namespace: str | None = None
        #: The deployment's alert rules, deduplication window and UI address (the process sets
        #: them from TREADLE_ALERT_RULES, _DEDUP_SECONDS and TREADLE_UI_BASE_URL).
        self.alerting = Alerting()
        self._index_scans = False

    @property
    def is_sqlite(self) -> bool:
        """True on the embedded SQLite backend."""
        return self.dialect == "sqlite"

    @property
    def supports_notify(self) -> bool:
        """True where workers can LISTEN for "work is ready" (else they rely on polling)."""
        return dialects.supports_notify(self.dialect)

    @property
    def supports_wakeups(self) -> bool:
        """True where a process can be woken when work is ready: LISTEN/NOTIFY on PostgreSQL,
        a usable wake-up folder on SQLite (else polling alone, with one warning)."""
        if self.wakeups is not None:
            return self.wakeups.usable()
        return self.supports_notify

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A short write transaction (on SQLite it takes the write lock at BEGIN).

        On SQLite, the wake-ups the transaction asked for (`dialects.notify_ready` ...) are sent
        once it has committed; never on rollback. A transaction that enlisted writes join
        (`enlisted`) reads the database clock once: every `db_now` in it, theirs and the use
        case's, is that one reading.
        """
        pending = None
        enlisted = [e for e in _ENLISTED.get() if not e.spent]
        try:
            with self.engine.begin() as conn:
                conn.info.pop(dialects.PENDING_WAKEUPS, None)
                conn.info.pop(dialects.SHARED_CLOCK, None)
                conn.info[_JOINED] = enlisted
                conn.info[audit.PENDING] = []
                if enlisted:
                    conn.info[dialects.SHARED_CLOCK] = None
                try:
                    for enlistment in enlisted:
                        enlistment.join(conn)
                    yield conn
                    audit.write_pending(conn)  # the transaction's audit entries, together
                finally:
                    pending = conn.info.pop(dialects.PENDING_WAKEUPS, None)
                    conn.info.pop(dialects.SHARED_CLOCK, None)
                    conn.info.pop(_JOINED, None)
                    conn.info.pop(audit.PENDING, None)
        except sa.exc.DBAPIError:
            raise  # a database error: `transact` may retry, and the enlistments join the retry
        except BaseException:
            for enlistment in enlisted:
                enlistment.spent = True
            raise
        for enlistment in enlisted:
            enlistment.spent = enlistment.committed = True
        if pending and self.wakeups is not None:
            self.wakeups.publish(pending)

    @contextmanager
    def enlisted(
        self, join: Callable[[Connection], None], *, finish: Callable[[Connection, Any], None] | None = None
    ) -> Iterator[Enlistment]:
        """Within the block, `join(conn)` runs first in the next write transaction of this
        context (thread or task), so its write commits or rolls back with that transaction's.
        `finish(conn, value)`, if given, runs last in it, before the commit, with the value the
        transaction's function returned (transactions run by `transact`).

        The API claims an Idempotency-Key this way inside the use case's own transaction, and
        records its response with the change; it records the request's audit entry the same way;
        reads (`query`) never join. Enlistments nest: an inner one joins after the outer ones.
        """
        enlistment = Enlistment(join, finish)
        token = _ENLISTED.set((*_ENLISTED.get(), enlistment))
        try:
            yield enlistment
        finally:
            _ENLISTED.reset(token)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read: on SQLite a deferred BEGIN, so readers never block writers; on MySQL a
        transaction; on PostgreSQL no transaction at all (autocommit): under READ COMMITTED each
        statement reads its own snapshot either way, and a read then costs one round trip per
        statement instead of two more for BEGIN and COMMIT."""
        with self.engine.connect() as raw:
            conn = raw.execution_options(treadle_readonly=True, **dialects.read_options(self.dialect))
            with conn.begin():
                yield conn

    def transact(
        self, fn: Callable[[Connection], T], *, attempts: int = 8, retry_conflicts: bool = False
    ) -> T:
        """Run `fn` in a write transaction, retrying transient errors with jittered backoff.

        `retry_conflicts` also retries unique violations, for upserts that race each other.
        """
        if self.on_call is None:
            return self._transact(fn, attempts=attempts, retry_conflicts=retry_conflicts)
        began = time.perf_counter()
        try:
            return self._transact(fn, attempts=attempts, retry_conflicts=retry_conflicts)
        finally:
            self.on_call("write", time.perf_counter() - began)

    def _transact(self, fn: Callable[[Connection], T], *, attempts: int, retry_conflicts: bool) -> T:
        for n in range(1, attempts + 1):
            try:
                with self.begin() as conn:
                    value = fn(conn)
                    for enlistment in conn.info.get(_JOINED, ()):
                        if enlistment.finish is not None:
                            enlistment.finish(conn, value)
                    return value
            except sa.exc.DBAPIError as exc:
                conflict = retry_conflicts and isinstance(exc, sa.exc.IntegrityError)
                if n == attempts or not (conflict or is_transient(exc)):
                    raise _translate(exc, self.url) from exc
                delay = min(0.05 * 2**n, 2.0) * (0.5 + random.random())
                log.warning(
                    "transient database error, retrying",
                    extra={"event": "store.retry", "attempt": n, "error": str(exc)[:200]},
                )
                time.sleep(delay)
        raise AssertionError("unreachable")

    def query(self, fn: Callable[[Connection], T], *, attempts: int = 8) -> T:
        """Run `fn` in a read transaction, retrying transient errors."""
        if self.on_call is None:
            return self._query(fn, attempts=attempts)
        began = time.perf_counter()
        try:
            return self._query(fn, attempts=attempts)
        finally:
            self.on_call("read", time.perf_counter() - began)

    def _query(self, fn: Callable[[Connection], T], *, attempts: int) -> T:
        for n in range(1, attempts + 1):
            try:
                with self.read() as conn:
                    return fn(conn)
            except sa.exc.DBAPIError as exc:
                if n == attempts or not is_transient(exc):
                    raise _translate(exc, self.url) from exc
                time.sleep(min(0.05 * 2**n, 2.0) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def prefer_index_scans(self) -> None:
        """Have this process's connections plan with an index wherever one serves (from the next
        connection on; pooled ones are closed). For the worker's hot path: its statements are
        prepared once, and a generic plan made while `task_instances` was small (no statistics,
        or a table never analysed) would keep scanning the whole table however large it grows."""
        setup = dialects.hot_path_session_setup(self.dialect)
        if setup is None or self._index_scans:
            return
        self._index_scans = True

        @event.listens_for(self.engine, "connect")
        def on_connect(dbapi_conn: Any, _record: Any) -> None:
            with dbapi_conn.cursor() as cur:
                cur.execute(setup)
            dbapi_conn.commit()

        self.engine.dispose()


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    return sa.engine.make_url(url).render_as_string(hide_password=True)


def _translate(exc: sa.exc.DBAPIError, url: str) -> Exception:
    """Connection failures become DatabaseUnavailable; anything else stays as it is."""
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        return DatabaseUnavailable(f"cannot use database {redact(url)}: {exc.orig or exc}")
    return exc


def db_now(conn: Connection) -> datetime:
    """Return the database's current time (the one clock treadle trusts), timezone-aware UTC."""
    return dialects.now(conn)


def _create_engine(url: str, application_name: str, pool_size: int, statement_timeout_s: float) -> Engine:
    if url.startswith("sqlite"):
        # Waiting for SQLite's one writer lock is the only wait there is.
        busy_s = min(statement_timeout_s, _SQLITE_BUSY_S)
        engine = sa.create_engine(
            url,
            connect_args={"timeout": busy_s, "check_same_thread": False},
            pool_size=pool_size,
            max_overflow=10,
        )
        _configure_sqlite(engine, busy_ms=round(busy_s * 1000))
        return engine
    connect_args: dict[str, Any] = {}
    if url.startswith("postgresql"):
        connect_args = postgres_connect_args(application_name, statement_timeout_s)
    options: dict[str, Any] = {}
    if url.startswith("mysql"):
        connect_args = {
            "init_command": _MYSQL_SESSION
            + f", innodb_lock_wait_timeout = {max(1, round(statement_timeout_s))}",
            "charset": "utf8mb4",
            "connect_timeout": _CONNECT_TIMEOUT_S,
            # A dead server or a silent network fails a call instead of hanging it.
            "read_timeout": max(round(statement_timeout_s) + 5, 5),
            "write_timeout": max(round(statement_timeout_s) + 5, 5),
        }
        # InnoDB's REPEATABLE READ keeps a snapshot from the first read, so a claim that locks a
        # pool row and then counts its running rows could count from a stale snapshot (F15);
        # READ COMMITTED reads the latest committed rows, as PostgreSQL does by default.
        options["isolation_level"] = "READ COMMITTED"
    return sa.create_engine(
        url, connect_args=connect_args, pool_size=pool_size, max_overflow=10, pool_recycle=3600, **options
    )


#: Seconds a session may idle inside a transaction before the server ends it and releases its
#: locks. None of ours pauses between statements (F13): only a client cut off mid-transaction
#: (a partition, a hung host) ever reaches it.
IDLE_IN_TRANSACTION_S = 60


def postgres_connect_args(application_name: str, statement_timeout_s: float) -> dict[str, Any]:
    """libpq settings: bounded statements and lock waits, and a dead peer noticed in seconds.

    Without them a call on a silently dropped connection blocks for the kernel's TCP timeouts
    (many minutes): keepalives probe an idle connection, `tcp_user_timeout` bounds how long
    sent data may stay unacknowledged.
    """
    ms = max(round(statement_timeout_s * 1000), 100)
    return {
        "application_name": application_name,
        # Keep our own transactions short (F13): nothing of ours idles inside one.
        "options": (
            f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_S * 1000} "
            f"-c statement_timeout={ms} -c lock_timeout={ms}"
        ),
        "connect_timeout": _CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": max(ms, 10_000) + 5_000,
    }


#: Session settings for MySQL/MariaDB. UTC time zone: NOW() and TIMESTAMP values then agree
#: with UTC_TIMESTAMP(). Strict mode even where the server runs without it: a value too long
#: for its column is an error, never silently cut. MariaDB (10.3+, the executable comment) ends
#: a transaction left idle as PostgreSQL does: without it, a client cut off mid-transaction
#: keeps its row locks until `wait_timeout` (eight hours by default), and a reaper waiting on
#: the lost attempt's row could not end it meanwhile.
_MYSQL_SESSION = (
    "SET time_zone = '+00:00', sql_mode = CONCAT_WS(',', NULLIF(@@sql_mode, ''), 'STRICT_TRANS_TABLES')"
    f" /*M!100300 , idle_transaction_timeout = {IDLE_IN_TRANSACTION_S} */"
)


def _configure_sqlite(engine: Engine, *, busy_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Driver autocommit: we issue BEGIN ourselves so writers take the lock up front
        # (BEGIN IMMEDIATE) and wait on busy_timeout instead of failing mid-transaction.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA busy_timeout={busy_ms}")
        cur.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Connection) -> None:
        readonly = conn.get_execution_options().get("treadle_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")
