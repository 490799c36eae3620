"""Task instance queries on every dialect: fan-in counters, emulated RETURNING, identifiers."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from treadle.domain.states import TaskState
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now
from treadle.store.tables import dags
from treadle.store.tables import task_instances as ti


def _row(task_id: str, *, state: TaskState = TaskState.PENDING, upstream_total: int = 0) -> dict[str, object]:
    return {
        "run_id": "r",
        "dag_id": "d",
        "task_id": task_id,
        "state": state.value,
        "upstream_total": upstream_total,
        "queue_timeout_s": 30.25,
    }


def test_fan_in_row_is_queued_only_by_the_completion_that_fills_its_counter(db: Database) -> None:
    with db.begin() as conn:
        ti_store.insert_task_instances(
            conn, [_row("join", upstream_total=2), _row("other", upstream_total=3)]
        )
    increments = {("r", "join"): 1, ("r", "other"): 1}
    with db.begin() as conn:
        assert not ti_store.count_upstream_successes(conn, increments=increments, now=db_now(conn))
    with db.begin() as conn:
        now = db_now(conn)
        assert ti_store.count_upstream_successes(conn, increments=increments, now=now)
    with db.read() as conn:
        rows = {r.task_id: r for r in conn.execute(sa.select(ti))}
    join, other = rows["join"], rows["other"]
    assert (join.state, join.upstream_done, join.queued_at) == ("queued", 2, now)
    assert join.dispatch_deadline == now + timedelta(seconds=30.25)  # microseconds survive
    assert (other.state, other.upstream_done, other.queued_at, other.dispatch_deadline) == (
        "pending",
        2,
        None,
        None,
    )


def test_end_running_many_returns_only_the_rows_it_moved(db: Database) -> None:
    with db.begin() as conn:
        ti_store.insert_task_instances(
            conn, [_row("a", state=TaskState.QUEUED), _row("b", state=TaskState.QUEUED)]
        )
        ids = {r.task_id: r.id for r in conn.execute(sa.select(ti.c.id, ti.c.task_id))}
        claimed = ti_store.claim(
            conn,
            worker_id="w",
            hostname="h",
            queues=["default"],
            limit=5,
            start=5,
            now=db_now(conn),
            lease_s=60,
        )
    assert sorted(r.id for r in claimed) == sorted(ids.values())
    assert {r.attempt for r in claimed} == {1}
    with db.begin() as conn:
        ended = ti_store.end_running_many(
            conn,
            held=[(ids["a"], 1), (ids["b"], 2)],  # b is at attempt 1: a stale fence moves nothing
            new_state=TaskState.SUCCESS,
            worker_id="w",
            now=db_now(conn),
        )
        renewed, skipped = ti_store.extend_leases(
            conn, worker_id="w", held=[(ids["a"], 1), (ids["b"], 1)], now=db_now(conn), lease_s=60
        )
    assert list(ended) == [(ids["a"], 1)]
    assert (renewed, skipped) == ({(ids["b"], 1)}, set())


def test_identifiers_are_case_sensitive(db: Database) -> None:
    with db.begin() as conn:
        now = db_now(conn)
        for dag_id in ("ETL", "etl"):
            conn.execute(sa.insert(dags).values(dag_id=dag_id, owner="o", tags=[], updated_at=now))
        found = conn.execute(sa.select(dags.c.dag_id).where(dags.c.dag_id == "etl")).scalars().all()
    assert found == ["etl"]
