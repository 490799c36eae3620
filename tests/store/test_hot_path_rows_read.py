"""The hot path's statements read the rows they change, not every row in the same state.

A table that was never analysed (autovacuum off, or a large run just inserted) gives the
PostgreSQL planner no statistics; a statement that finds its rows by id and checks their state
could then be served from a state-led index and step over every queued or running row, so a
claim or a start would cost in proportion to the queue. These tests fill such a table and count,
with PostgreSQL's own per-transaction counters, how many task-instance rows each statement read.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.domain.task_records import AttemptRow
from treadle.store import successes
from treadle.store import task_instances as ti_store
from treadle.store.database import Database
from treadle.store.tables import task_instances as ti

pytestmark = pytest.mark.postgres

#: Rows in the state the statements must not scan.
CROWD = 20_000
#: Generous bound on rows one statement of ten rows may read (index and heap, with retries).
READ_BOUND = 300
#: Statements run this many times, past psycopg's prepare threshold (5).
PASSES = 8


@pytest.fixture
def pg(pg_url: str) -> Iterator[Database]:
    database = Database(pg_url)
    try:
        yield database
    finally:
        database.dispose()


def _fill(conn: Connection, state: TaskState, count: int, *, worker: str | None = None) -> None:
    ti_store.insert_task_instances(
        conn,
        [
            {
                "run_id": "crowd",
                "dag_id": "d",
                "task_id": f"t{i}",
                "state": state.value,
                "worker_id": worker,
                "attempt": 1 if state is TaskState.RUNNING else 0,
                "upstream_total": 0,
                "queue_timeout_s": 600.0,
            }
            for i in range(count)
        ],
    )


def _rows_read(conn: Connection) -> int:
    """Task-instance rows this transaction has read so far (index fetches and heap scans)."""
    row = conn.execute(
        sa.text(
            "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) "
            "FROM pg_stat_xact_user_tables WHERE relname = 'task_instances'"
        )
    ).one()
    return int(row[0])


def _claims_of_ten(pg: Database, times: int) -> list[int]:
    """Claim ten queued instances `times` times, each in its own transaction; the rows each read."""
    reads = []
    for _ in range(times):
        with pg.begin() as conn:
            before = _rows_read(conn)
            claimed = ti_store.claim(
                conn, worker_id="w", hostname="h", queues=["default"], limit=10, start=2, now=None, lease_s=60
            )
            reads.append(_rows_read(conn) - before)
        assert len(claimed) == 10
    return reads


def _claimed_beside_running(pg: Database, *, start: int) -> list[AttemptRow]:
    """Ten attempts claimed by worker "w" (the first `start` started) beside CROWD running ones
    of another worker."""
    with pg.begin() as conn:
        _fill(conn, TaskState.RUNNING, CROWD, worker="others")
        ti_store.insert_task_instances(
            conn,
            [
                {"run_id": "mine", "dag_id": "d", "task_id": f"m{i}", "state": "queued", "upstream_total": 0}
                for i in range(10)
            ],
        )
    with pg.begin() as conn:
        return ti_store.claim(
            conn, worker_id="w", hostname="h", queues=["default"], limit=10, start=start, now=None, lease_s=60
        )


def test_a_claim_reads_its_rows_not_the_queue(pg: Database) -> None:
    with pg.begin() as conn:
        _fill(conn, TaskState.QUEUED, CROWD)
    # Past the driver's prepare threshold too: a prepared statement's generic plan is chosen
    # without the bound values and must not scan the queue either.
    reads = _claims_of_ten(pg, PASSES)
    assert max(reads) < READ_BOUND, f"claims of 10 read {reads} rows of {CROWD} queued"


def test_starting_buffered_attempts_reads_them_not_every_running_row(pg: Database) -> None:
    claimed = _claimed_beside_running(pg, start=0)
    assert len(claimed) == 10 and all(r.started_at is None for r in claimed)
    with pg.begin() as conn:
        before = _rows_read(conn)
        started = ti_store.start_claimed_many(
            conn, held=[(r.id, r.attempt) for r in claimed], worker_id="w", now=None
        )
        read = _rows_read(conn) - before
    assert len(started) == 10
    assert read < READ_BOUND, f"starting 10 read {read} rows beside {CROWD} running"


def test_recording_successes_reads_them_not_every_running_row(pg: Database) -> None:
    claimed = _claimed_beside_running(pg, start=10)
    rows = [
        successes.SuccessRow(
            task_instance_id=r.id,
            attempt=r.attempt,
            run_id=r.run_id,
            dag_id=r.dag_id,
            task_id=r.task_id,
            started_at=r.started_at,
            exit_code=0,
            code_version=None,
            outputs={},
            store=False,
            value=None,
        )
        for r in claimed
    ]
    with pg.begin() as conn:
        before = _rows_read(conn)
        successes.record_successes(conn, rows, [], worker_id="w", hostname="h")
        read = _rows_read(conn) - before
    with pg.read() as conn:
        done = conn.execute(
            sa.select(sa.func.count()).where(ti.c.run_id == "mine", ti.c.state == TaskState.SUCCESS.value)
        ).scalar_one()
    assert done == 10
    assert read < READ_BOUND, f"recording 10 successes read {read} rows beside {CROWD} running"


def test_a_claim_planned_while_the_table_was_small_does_not_scan_it_once_it_grew(pg: Database) -> None:
    """The worker's connections prefer index scans: the claim's generic plan, made while the
    table held a few rows, must not go on scanning the whole table once a large run is in."""
    pg.prefer_index_scans()
    with pg.begin() as conn:
        _fill(conn, TaskState.QUEUED, PASSES)
    for _ in range(PASSES):  # past the prepare threshold, on a table of a few rows
        with pg.begin() as conn:
            assert (
                len(
                    ti_store.claim(
                        conn,
                        worker_id="w",
                        hostname="h",
                        queues=["default"],
                        limit=1,
                        start=1,
                        now=None,
                        lease_s=60,
                    )
                )
                == 1
            )
    with pg.begin() as conn:
        ti_store.insert_task_instances(
            conn,
            [
                {"run_id": "big", "dag_id": "d", "task_id": f"b{i}", "state": "queued", "upstream_total": 0}
                for i in range(CROWD)
            ],
        )
    reads = _claims_of_ten(pg, 3)
    assert max(reads) < READ_BOUND, f"claims of 10 read {reads} rows of {CROWD} queued"
