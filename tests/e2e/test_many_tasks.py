"""Two worker processes on PostgreSQL share 500 task instances: each runs exactly once."""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.store.tables import task_attempts, task_instances, workers

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

CHAINS, STEPS = 100, 5  # 500 task instances: 100 independent chains of 5 steps

MANY_DAG = """
    from __future__ import annotations

    import os

    from treadle import TaskContext, dag, task

    EFFECTS = __EFFECTS__
    CHAINS, STEPS = __CHAINS__, __STEPS__


    def effect(context: TaskContext) -> int:
        # One write(2) on an O_APPEND descriptor: concurrent lines never interleave.
        line = f"{context.run_id} {context.task_id} {context.attempt} {os.getpid()}\\n"
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        return context.attempt


    @dag(dag_id="many")
    def many() -> None:
        for chain in range(CHAINS):
            previous: list[str] = []
            for step in range(STEPS):
                task_id = f"c{chain:03d}_s{step}"
                task(task_id=task_id, depends_on=previous)(effect)()
                previous = [task_id]
"""


def test_two_workers_run_500_task_instances_exactly_once(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url)
    effects = c.root / "effects.log"
    c.write_dag("many.py", MANY_DAG, effects=str(effects), chains=CHAINS, steps=STEPS)
    expected = {f"c{chain:03d}_s{step}" for chain in range(CHAINS) for step in range(STEPS)}
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("w1", concurrency=3)
    c.worker("w2", concurrency=3)

    def workers_up() -> bool:
        with c.db.read() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(workers)).scalar_one() == 2

    wait_for(workers_up, timeout=30, message="both workers to register")

    run_id = c.trigger("many")
    detail = c.wait_run(run_id, timeout=120)

    assert detail.run.state == "success"
    assert len(detail.task_instances) == len(expected) == 500
    assert {t.task_id for t in detail.task_instances} == expected
    assert {(t.state, t.attempt) for t in detail.task_instances} == {("success", 1)}
    # History: exactly one attempt per task instance, each a success.
    per_instance = collections.Counter(a.task_instance_id for a in detail.attempts)
    assert set(per_instance.values()) == {1} and len(per_instance) == 500
    assert {a.outcome for a in detail.attempts} == {"success"}
    assert detail.results == dict.fromkeys(expected, 1)
    # Side effects: every task ran exactly once, in its first attempt.
    lines = [line.split() for line in effects.read_text().splitlines()]
    assert len(lines) == 500
    runs_seen = collections.Counter((run, task_id, attempt) for run, task_id, attempt, _pid in lines)
    assert set(runs_seen) == {(run_id, t, "1") for t in expected}
    assert set(runs_seen.values()) == {1}
    # Both workers took part (the exactly-once above is about concurrent claimers).
    with c.db.read() as conn:
        by_worker = dict(
            conn.execute(
                sa.select(task_attempts.c.worker_id, sa.func.count())
                .where(task_attempts.c.run_id == run_id)
                .group_by(task_attempts.c.worker_id)
            ).all()
        )
        leftovers = conn.execute(
            sa.select(sa.func.count())
            .select_from(task_instances)
            .where(task_instances.c.lease_expires_at.is_not(None))
        ).scalar_one()
    assert len(by_worker) == 2, by_worker
    assert sum(by_worker.values()) == 500
    assert leftovers == 0
