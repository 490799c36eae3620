"""The few places where SQLite, PostgreSQL and MySQL/MariaDB differ: clock, claim locking,
UPDATE ... RETURNING, upserts, notifications (wake-ups). Nothing outside this module branches on dialect.

MySQL/MariaDB (10.6+ for SKIP LOCKED) differs most: it has no UPDATE ... RETURNING (emulated
below in the same transaction, fenced by the same guard), no `FOR UPDATE OF`, and no NOTIFY
(workers rely on their bounded poll, which is always running anyway; SQLite has no NOTIFY either,
its wake-ups are datagrams sent after the commit, store/wakeups.py). One gap is in the
schema (tables.py): a utf8mb4 key holds at most 3072 bytes, so `dag_load_errors.fileloc`
is VARCHAR(768) there, not 1000.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store.tables import JSONDocument, UTCDateTime

SelectT = TypeVar("SelectT", bound=sa.Select[Any])
T = TypeVar("T")

#: Channel that workers LISTEN on for "a task became ready".
READY_CHANNEL = "treadle_ready"
#: Channel that tells workers to renew their leases now (a running attempt was cancelled).
CANCEL_CHANNEL = "treadle_cancel"
#: Channel that wakes an idle scheduler for work only it does (a backfill to drain).
SCHEDULER_CHANNEL = "treadle_scheduler"


#: conn.info key: present while a transaction shares one clock reading (None until it is read).
SHARED_CLOCK = "treadle_shared_clock"


def now(conn: Connection) -> datetime:
    """Return the database clock as an aware UTC datetime (the transaction's one reading, when
    it shares one: `Database.begin`)."""
    shared = conn.info.get(SHARED_CLOCK)
    if shared is not None:
        assert isinstance(shared, datetime)
        return shared
    value = clock_value(conn, conn.execute(sa.select(clock_sql(conn))).scalar_one())
    if SHARED_CLOCK in conn.info:
        conn.info[SHARED_CLOCK] = value
    return value


def clock_sql(conn: Connection) -> sa.ColumnElement[Any]:
    """The database clock as a column to select beside others (`clock_value` reads it): a
    statement that needs the time reads it with its rows, in the same round trip."""
    if conn.dialect.name == "sqlite":
        return sa.func.strftime("%Y-%m-%d %H:%M:%f", "now")
    if conn.dialect.name == "mysql":
        # UTC_TIMESTAMP is UTC whatever the session time zone; (6) keeps the microseconds.
        return sa.func.utc_timestamp(6)
    return sa.func.clock_timestamp()


def clock_value(conn: Connection, value: Any) -> datetime:
    """The aware UTC datetime of a `clock_sql` column's value."""
    if conn.dialect.name == "sqlite":
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    assert isinstance(value, datetime)
    if conn.dialect.name == "mysql":
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def lock_for_claim(stmt: SelectT, conn: Connection, *, of: sa.Table | None = None) -> SelectT:
    """Add row locking (of `of`'s rows) that skips rows other claimers hold.

    SQLite has no row locks: its single writer lock (BEGIN IMMEDIATE) serialises claims.
    MariaDB has no `FOR UPDATE OF`: it locks every table the statement reads by join, so claim
    queries read other tables through `claim_lookup` (a subquery, which is not locked).
    """
    if conn.dialect.name == "sqlite":
        return stmt
    if conn.dialect.name == "mysql":
        return stmt.with_for_update(skip_locked=True)
    return stmt.with_for_update(skip_locked=True, of=of)


def locks_rejected_rows(conn: Connection) -> bool:
    """Whether a locking read keeps its lock on rows its WHERE then rejects: InnoDB locks every
    row it visits, even under READ COMMITTED; PostgreSQL checks the WHERE before it locks."""
    return conn.dialect.name == "mysql"


def claim_lookup(
    conn: Connection, base: sa.Table, column: sa.Column[Any], *, on: sa.ColumnElement[bool]
) -> tuple[sa.FromClause, sa.ColumnElement[Any]]:
    """The FROM clause and column to read `column` of another table beside claimable `base` rows.

    An outer join where the lock can name `base` alone. On MySQL/MariaDB a joined row would be
    locked too, and one that another claimer holds would be skipped by SKIP LOCKED, which
    null-extends the outer join (a DAG limit would read as "none"); a correlated scalar
    subquery reads the row without locking it.
    """
    if conn.dialect.name == "mysql":
        lookup = sa.select(column).where(on).scalar_subquery().label(column.name)
        return base, lookup
    return base.outerjoin(column.table, on), column


def plus_seconds(conn: Connection, base: Any, seconds: Any) -> Any:
    """SQL for `base + seconds` (a timestamp expression plus a number column); NULL stays NULL."""
    expr: sa.ColumnElement[Any]
    if conn.dialect.name == "sqlite":
        # printf() would turn NULL into 0 seconds: keep "no deadline" NULL explicitly.
        modifier = sa.func.printf("%+f seconds", seconds)
        expr = sa.case((seconds.is_(None), None), else_=sa.func.strftime("%Y-%m-%d %H:%M:%f", base, modifier))
    elif conn.dialect.name == "mysql":
        # TIMESTAMPADD counts whole units: in microseconds a fractional timeout keeps its fraction.
        micros = sa.cast(sa.func.round(seconds * 1_000_000), sa.BigInteger)
        expr = sa.func.timestampadd(sa.literal_column("MICROSECOND"), micros, base)
    else:
        expr = base + sa.literal_column("interval '1 second'") * seconds
    return sa.type_coerce(expr, UTCDateTime())


def supports_notify(dialect_name: str) -> bool:
    """True for PostgreSQL, the one backend with LISTEN/NOTIFY."""
    return dialect_name == "postgresql"


def statement_clock(conn: Connection) -> datetime | None:
    """The `now` hot-path statements stamp rows with: None on PostgreSQL, where each statement
    writes `statement_timestamp()` and returns it (one round trip fewer than reading the clock
    first); elsewhere the database clock read first (SQLite reads it in-process, cheaply, and
    keeps every stored time in the one text format its comparisons rely on)."""
    return None if conn.dialect.name == "postgresql" else now(conn)


def notify_cancel(conn: Connection) -> None:
    """Ask workers to check their attempts at once (a hint: heartbeats catch it anyway)."""
    _notify(conn, CANCEL_CHANNEL)


def notify_scheduler(conn: Connection) -> None:
    """Wake an idle scheduler after the commit (a hint: it also looks on its own, less often)."""
    _notify(conn, SCHEDULER_CHANNEL)


#: Key in `Connection.info` of the channels a SQLite transaction notified, sent once it commits.
PENDING_WAKEUPS = "treadle_pending_wakeups"


def _notify(conn: Connection, channel: str) -> None:
    """NOTIFY on PostgreSQL (delivered at commit); on SQLite the channel is kept on the connection
    and `Database.begin` sends it after the commit (store/wakeups.py); MySQL/MariaDB: nothing."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"NOTIFY {channel}")
    elif conn.dialect.name == "sqlite":
        conn.info.setdefault(PENDING_WAKEUPS, set()).add(channel)


#: Statements built once per process and dialect (see `built_once`).
_BUILT: dict[tuple[str, Hashable], Any] = {}


def built_once(conn: Connection, key: Hashable, build: Callable[[], T]) -> T:
    """The statement `build` makes for this connection's dialect, built on the first call only.

    Hot-path statements whose shape depends only on the dialect and `key` are built once with
    bound parameters: SQLAlchemy then skips constructing them and computing their cache keys on
    every call, which cost more than the database's own work for a short transaction.
    """
    cache_key = (conn.dialect.name, key)
    found = _BUILT.get(cache_key)
    if found is None:
        found = _BUILT[cache_key] = build()
    return cast(T, found)


def unindexed(conn: Connection, column: Any) -> Any:
    """`column` as a guard that no index may serve (PostgreSQL: `column || ''`), for statements
    that find their rows by primary key and only check the state on them.

    Without statistics (a table never analysed, or one a large run has just filled) the planner
    may serve `id IN (...) AND state = 'queued'` from a state-led index and step over every row
    in that state, so a claim or a start costs in proportion to the queue. The primary key is
    then the only index left to it."""
    if conn.dialect.name == "postgresql":
        return column.op("||")(sa.literal_column("''"))
    return column


def hot_path_session_setup(dialect_name: str) -> str | None:
    """The session setting a worker's connections take (`Database.prefer_index_scans`): on
    PostgreSQL, sequential scans only where no index serves a statement."""
    if dialect_name == "postgresql":
        return "SET enable_seqscan = off"
    return None


#: `unindexed` in the PostgreSQL-only statements written as SQL text (store/successes.py).
UNINDEXED_STATE = "(t.state || '')"


def has_update_returning(conn: Connection) -> bool:
    """True where UPDATE ... RETURNING is one statement (not emulated as on MySQL/MariaDB)."""
    return bool(conn.dialect.update_returning)


def has_writable_ctes(conn: Connection) -> bool:
    """True where one statement may hold several data-modifying CTEs (PostgreSQL): the hot path
    then records a batch of successes in one round trip (store/successes.py)."""
    return conn.dialect.name == "postgresql"


def update_returning(
    conn: Connection, stmt: sa.Update, columns: Sequence[sa.ColumnElement[Any]], *, key: sa.Column[Any]
) -> list[sa.Row[Any]]:
    """Run a guarded UPDATE and return `columns` of the rows it changed (UPDATE ... RETURNING).

    MySQL/MariaDB have no UPDATE ... RETURNING: the rows that match the guard are locked
    (`SELECT key ... FOR UPDATE`, waiting as the UPDATE would), updated by key with the guard
    kept, and read back, all in the caller's transaction. Locked rows cannot change in between,
    so the rows read back are exactly the rows the UPDATE moved. Other dialects: one statement.
    """
    if conn.dialect.update_returning:
        return list(conn.execute(stmt.returning(*columns)))
    locked = sa.select(key).where(stmt.whereclause if stmt.whereclause is not None else sa.true())
    keys = list(conn.execute(locked.with_for_update()).scalars())
    if not keys:
        return []
    conn.execute(stmt.where(key.in_(keys)))
    return list(conn.execute(sa.select(*columns).where(key.in_(keys))))


def read_options(dialect: str) -> dict[str, Any]:
    """Execution options of a read (`Database.read`): on PostgreSQL, autocommit. Its READ
    COMMITTED gives each statement its own snapshot inside a transaction too, so a read loses
    nothing outside one and saves the BEGIN and COMMIT round trips. MySQL's reads keep their
    transaction, and SQLite's its deferred BEGIN (one snapshot for the read)."""
    return {"isolation_level": "AUTOCOMMIT"} if dialect == "postgresql" else {}


def plan_each_statement(conn: Connection) -> None:
    """Plan this transaction's statements for their parameters (PostgreSQL), never from a
    cached generic plan.

    psycopg prepares a statement once it has run five times, and after five more PostgreSQL may
    switch it to a generic plan. For a batch read such as `dag_id IN (500 parameters)` over a
    table never analysed that plan scans the table and compares each row with the list one by
    one: 170 ms a batch instead of 11 ms with the list's values hashed, which made an unchanged
    `dags sync` of 10,000 DAGs spend four seconds reading. For transactions of a few large
    statements, whose planning costs little next to their execution.
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")


def limited_keys(conn: Connection, select: sa.Select[Any]) -> Any:
    """`select` (one key column, with a LIMIT) as the target list of an UPDATE on the same table.

    A subquery on other dialects. MySQL/MariaDB refuse both LIMIT inside IN (...) and a
    subquery on the table being updated, so the keys are read first and passed as a list (the
    UPDATE keeps its own guard). They are read without locks, then locked by key, skipping
    rows another session holds: InnoDB's locking read locks, or waits on, every row its scan
    visits, matching or not (a range scan reads one entry past its range), so locking in the
    first read would hold rows this pass never changes, such as a running attempt whose
    worker then skips its lease renewal, and one row locked by a client cut off mid-transaction
    would stall the whole pass. A skipped row is taken next pass.
    """
    if conn.dialect.name == "mysql":
        keys = list(conn.execute(select).scalars())
        if not keys:
            return keys
        [column] = select.selected_columns
        by_key = sa.select(column).where(column.in_(keys)).with_for_update(skip_locked=True)
        return list(conn.execute(by_key).scalars())
    return select.scalar_subquery()


def upsert(conn: Connection, table: sa.Table, *, key: str, update: Sequence[str]) -> Any:
    """INSERT that replaces `update` columns of the row with the same `key` (built once per dialect).

    ON CONFLICT ... DO UPDATE on SQLite and PostgreSQL; ON DUPLICATE KEY UPDATE on MySQL, where
    `key` must be the table's only unique key (it is for the tables this is used on).
    """
    cache_key = (conn.dialect.name, table.name, key, tuple(update))
    found = _UPSERTS.get(cache_key)
    if found is None:
        if conn.dialect.name == "mysql":
            mine = _dialect_insert(conn)(table)
            found = mine.on_duplicate_key_update({c: mine.inserted[c] for c in update})
        else:
            stmt = _dialect_insert(conn)(table)
            found = stmt.on_conflict_do_update(
                index_elements=[table.c[key]], set_={c: stmt.excluded[c] for c in update}
            )
        _UPSERTS[cache_key] = found
    return found


_UPSERTS: dict[tuple[str, str, str, tuple[str, ...]], Any] = {}


def notify_ready(conn: Connection) -> None:
    """Wake idle workers (and an idle scheduler) after the transaction commits (a hint, never
    needed: they poll too). PostgreSQL: NOTIFY; SQLite: a datagram per listening process
    (store/wakeups.py); MySQL/MariaDB have neither: their workers find new work by polling.
    """
    _notify(conn, READY_CHANNEL)


def json_array_elements(conn: Connection, value: Any) -> tuple[sa.FromClause, Any, Any]:
    """A FROM item with one row per element of the JSON array `value` (a column of a table that
    precedes it in the FROM clause), its position from 0 and the element as JSON.

    PostgreSQL: `jsonb_array_elements ... WITH ORDINALITY` (lateral). SQLite: `json_each`, whose
    values are SQL values: strings are quoted back to JSON, numbers turned to their JSON text,
    and booleans (1 and 0 there) written true and false. MySQL/MariaDB: `JSON_TABLE`.
    """
    if conn.dialect.name == "postgresql":
        pg = sa.func.jsonb_array_elements(value).table_valued("value", with_ordinality="n")
        rows = pg.render_derived().lateral("elements")
        return rows, rows.c.n - 1, rows.c.value
    if conn.dialect.name == "mysql":
        columns: Any = sa.literal_column("'$[*]' COLUMNS (n FOR ORDINALITY, element JSON PATH '$')")
        my = sa.func.json_table(value, columns).table_valued("n", "element").alias("elements")
        return my, my.c.n - 1, my.c.element
    lite = sa.func.json_each(value).table_valued("key", "value", "type").alias("elements")
    element = sa.case(
        (lite.c.type == "text", sa.func.json_quote(lite.c.value)),
        (lite.c.type == "true", sa.literal("true")),
        (lite.c.type == "false", sa.literal("false")),
        (lite.c.type == "null", sa.literal("null")),
        else_=sa.cast(lite.c.value, sa.Text),
    )
    return lite, lite.c.key, element


def insert_ignore(conn: Connection, table: sa.Table) -> Any:
    """INSERT that skips rows whose key exists (ON CONFLICT DO NOTHING / INSERT IGNORE)."""
    if conn.dialect.name == "mysql":
        return sa.insert(table).prefix_with("IGNORE")
    return _dialect_insert(conn)(table).on_conflict_do_nothing()


def inserted_rows(conn: Connection, stmt: Any, *columns: sa.ColumnElement[Any]) -> list[Any] | None:
    """Run an `insert_ignore` statement and return the rows it inserted (RETURNING `columns`:
    none when it skipped), or None where the dialect cannot tell in the same statement (MySQL's
    INSERT IGNORE): the caller reads the row back."""
    if conn.dialect.name == "mysql":
        conn.execute(stmt)
        return None
    return list(conn.execute(stmt.returning(*columns)))


def _dialect_insert(conn: Connection) -> Any:
    """The connection's dialect's own `insert` (with its ON CONFLICT / ON DUPLICATE KEY forms).

    Imported here, not at the top: a command on SQLite need not load the PostgreSQL and MySQL
    dialects (and their drivers) to start.
    """
    name = conn.dialect.name
    if name == "mysql":
        from sqlalchemy.dialects import mysql

        return mysql.insert
    if name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert
    from sqlalchemy.dialects import sqlite

    return sqlite.insert


def lock_row(stmt: SelectT, conn: Connection, *, shared: bool = False) -> SelectT:
    """`SELECT ... FOR UPDATE` (or `FOR SHARE`) where rows can be locked (SQLite's writer lock
    already serialises)."""
    return stmt if conn.dialect.name == "sqlite" else stmt.with_for_update(read=shared)


def insert_many(conn: Connection, table: sa.Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert many rows that all have the same keys, in the caller's transaction.

    On PostgreSQL the rows go straight to psycopg's pipelined executemany: SQLAlchemy's
    per-row parameter processing cost more than the database's work for a burst of runs.
    Values must already be what the columns store (aware UTC datetimes, JSON-able dicts).
    Elsewhere it is SQLAlchemy's executemany.
    """
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(sa.insert(table), list(rows))
        return
    from psycopg.types.json import Jsonb

    columns = list(rows[0])
    as_json = [isinstance(table.c[c].type, JSONDocument | sa.JSON) for c in columns]
    quote = conn.dialect.identifier_preparer.quote
    sql = (
        f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    params = [
        tuple(
            Jsonb(row[c]) if j and row[c] is not None else row[c]
            for c, j in zip(columns, as_json, strict=True)
        )
        for row in rows
    ]
    driver = conn.connection.driver_connection
    assert driver is not None
    error = conn.dialect.loaded_dbapi.Error
    try:
        with driver.cursor() as cursor:
            cursor.executemany(sql, params)
    except error as exc:
        # Raised as SQLAlchemy's own calls raise it (IntegrityError, OperationalError, ...), so
        # that `Database.transact` recognises a conflict to retry or a lost connection.
        raise sa.exc.DBAPIError.instance(sql, params, exc, error) from exc
