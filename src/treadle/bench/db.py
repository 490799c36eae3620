"""What benchmarks read from the database under test, the same way on SQLite and PostgreSQL.

Reads go through treadle's own connection factory and table definitions, so timestamps come
back as aware UTC datetimes on every backend. The clock is the database's (`db_now`): on
PostgreSQL the server's, on SQLite the host's, read by SQLite itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from treadle.domain.urls import parse_database_url, sqlite_file
from treadle.store import leases
from treadle.store.database import Database, db_now
from treadle.store.tables import task_instances

#: Rows read back, each a plain tuple.
Rows = list[tuple[Any, ...]]
#: Run ids per statement when reading task instances of many runs.
_CHUNK = 500


class BenchDb:
    """A small pool on the benchmark's database, for reads and the database clock."""

    def __init__(self, url: str) -> None:
        self.db = Database(url, application_name="treadle-bench", pool_size=2)
        found = sqlite_file(parse_database_url(url))
        #: The database file on SQLite; None on a server.
        self.sqlite_path = None if found is None else Path(found)

    def now(self) -> datetime:
        """The database clock."""
        return self.db.query(db_now)

    def rows(self, stmt: sa.Executable) -> Rows:
        """Every row a statement returns, as tuples (in one read transaction)."""
        return self.db.query(lambda conn: [tuple(row) for row in conn.execute(stmt)])

    def scalar(self, stmt: sa.Executable) -> Any:
        """The first column of the first row (None without a row)."""
        return self.db.query(lambda conn: conn.execute(stmt).scalar())

    def lease(self, name: str = "scheduler") -> leases.LeaseInfo | None:
        """A named lease as stored (the scheduler leader's by default)."""
        return self.db.query(lambda conn: leases.get(conn, name))

    def wait_until(self, when: datetime, alive: Callable[[], None], *, step_s: float = 0.5) -> None:
        """Sleep until the database clock passes `when`, calling `alive()` (which raises if a
        process died) between naps."""
        while (left := (when - self.now()).total_seconds()) > 0:
            alive()
            time.sleep(min(left, step_s))

    def has_session(self, pid: int) -> bool:
        """True once process `pid` uses the database: a PostgreSQL session on its TCP port, or
        the SQLite file open among its descriptors (Linux /proc)."""
        if self.sqlite_path is not None:
            return self.sqlite_path.resolve() in open_files(pid)
        ports = local_tcp_ports(pid)
        if not ports:
            return False
        found = self.rows(
            sa.text("SELECT client_port FROM pg_stat_activity WHERE datname = current_database()")
        )
        return any(row[0] in ports for row in found)

    def close(self) -> None:
        """Close the pool."""
        self.db.dispose()


def ready_to_started(
    bdb: BenchDb, run_ids: Iterable[str], *, with_upstream: bool | None = None
) -> list[float]:
    """Seconds from ready (`queued_at`) to started (`started_at`) of first attempts in some runs.

    Both stamps are the database's: `queued_at` is written by the transaction that made the
    instance ready (the trigger for roots, the upstream's completion for the others),
    `started_at` by the claim or the dispatch pass that handed it to a task process.
    `with_upstream`: True for instances readied by an upstream, False for roots, None for all.
    """
    ti = task_instances
    ids = list(run_ids)
    out: list[float] = []
    for first in range(0, len(ids), _CHUNK):
        stmt = sa.select(ti.c.queued_at, ti.c.started_at, ti.c.upstream_total).where(
            ti.c.run_id.in_(ids[first : first + _CHUNK]),
            ti.c.attempt == 1,
            ti.c.queued_at.is_not(None),
            ti.c.started_at.is_not(None),
        )
        for queued, started, upstream_total in bdb.rows(stmt):
            if with_upstream is None or (upstream_total > 0) == with_upstream:
                out.append((started - queued).total_seconds())
    return out


def open_files(pid: int) -> set[Path]:
    """Files a process has open (empty once it is gone or unreadable)."""
    found = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("/"):
                found.add(Path(target))
    except OSError:
        return set()
    return found


def local_tcp_ports(pid: int) -> set[int]:
    """Local ports of a process's TCP sockets (Linux /proc; empty elsewhere or once it is gone)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
