"""The pipelined worker keeps every attempt's record whole, on each backend.

Slots hand successes over and take their next attempt at once (on PostgreSQL straight from the
buffer, its start recorded by the next pass), so an attempt may finish before its start is
written. Its record must still have a start, an end after it and a duration; every task must run
exactly once; a chain's results must flow through; nothing may be left buffered or held.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.store.tables import task_attempts, task_instances

pytestmark = [pytest.mark.e2e]

TASKS = 300

FAST_DAG = """
    from __future__ import annotations

    import os

    from treadle import TaskContext, dag, task

    EFFECTS = __EFFECTS__


    def effect(context: TaskContext) -> None:
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{context.task_id} {context.attempt}\\n".encode())
        os.close(fd)


    @task
    def step(n: int) -> int:
        return n + 1


    @dag(dag_id="fast")
    def fast() -> None:
        for n in range(__TASKS__):
            task(task_id=f"t{n:04d}")(effect)()
        value = step(0)
        for _ in range(29):
            value = step(value)
"""


def test_fast_tasks_through_the_pipelined_worker_keep_whole_records(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url)
    effects = c.root / "effects.log"
    c.write_dag("fast.py", FAST_DAG, effects=str(effects), tasks=TASKS)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "2")
    run_id = c.trigger("fast")
    detail = c.wait_run(run_id, timeout=240)
    assert detail.run.state == "success", c.logs_tail()

    ran = collections.Counter(effects.read_text().split("\n")[:-1])
    assert len(ran) == TASKS and set(ran.values()) == {1}  # each task once, at its first attempt

    with c.db.read() as conn:
        attempts = conn.execute(
            sa.select(
                task_attempts.c.task_id,
                task_attempts.c.outcome,
                task_attempts.c.started_at,
                task_attempts.c.ended_at,
                task_attempts.c.duration_s,
            ).where(task_attempts.c.run_id == run_id)
        ).all()
        rows = conn.execute(
            sa.select(task_instances.c.started_at, task_instances.c.ended_at).where(
                task_instances.c.run_id == run_id
            )
        ).all()
    assert len(attempts) == TASKS + 30
    for a in attempts:
        assert a.outcome == "success"
        assert a.started_at is not None and a.ended_at is not None, a
        assert a.ended_at >= a.started_at and a.duration_s is not None and a.duration_s >= 0, a
    assert all(r.started_at is not None and r.ended_at >= r.started_at for r in rows)
    results = {t.task_id: t for t in detail.task_instances}
    assert len(results) == TASKS + 30

    with c.db.read() as conn:
        last = conn.execute(
            sa.text("SELECT value FROM task_results WHERE run_id = :r AND task_id = 'step__29'"),
            {"r": run_id},
        ).scalar()
    assert last is not None and int(str(last)) == 30

    # Nothing stays buffered or held once the run is over.
    wait_for(
        lambda: all(w["active"] == 0 and w["prefetched"] == 0 for w in c.cli_json("workers")),
        timeout=60,
        message="the worker to hold nothing",
    )
