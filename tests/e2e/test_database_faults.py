"""The database drops every treadle connection mid-run: no process exits, no task is lost (F6, F7).

`pg_terminate_backend` on every treadle backend (claims, completions, heartbeats, the LISTEN
connection) several times while 200 short tasks run. Transactions in flight fail and are
retried; the LISTEN connection reconnects; anything whose completion was lost is recovered by
the lease and retried. Every task must end success and both processes must still be running.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import PG_ADMIN_URL
from tests.e2e.conftest import SHORT_LEASE, Cluster
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SHORT_TASKS_DAG = """
    from __future__ import annotations

    import time

    from treadle import dag, task


    @task(retries=3, retry_delay=0)
    def step(n: int) -> int:
        time.sleep(0.02)
        return n


    @dag(dag_id="steady")
    def steady() -> None:
        for n in range(__COUNT__):
            step(n)
"""


def _terminate_treadle_backends(dbname: str) -> int:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND application_name LIKE 'treadle%%' "
            "AND application_name <> 'treadle-e2e-test' AND pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return len(rows)


def test_terminated_connections_lose_nothing(pg_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(pg_url, **SHORT_LEASE)
    c.write_dag("steady.py", SHORT_TASKS_DAG, count=200)
    assert c.cli("dags", "sync").returncode == 0
    scheduler = c.start("scheduler", "scheduler")
    worker = c.worker("w1", concurrency=4)
    c.wait_dag("steady")
    run_id = c.trigger("steady")
    dbname = pg_url.rsplit("/", 1)[1]

    def some_done() -> bool:
        return any(t.state == "success" for t in c.detail(run_id).task_instances)

    wait_for(some_done, timeout=60, message="the first tasks to finish")
    terminated = 0
    for _ in range(3):
        terminated += _terminate_treadle_backends(dbname)
        time.sleep(1.0)

    detail = c.wait_run(run_id, timeout=120)

    assert terminated > 0
    assert detail.run.state == "success", {t.task_id: t.state for t in detail.task_instances}
    assert {t.state for t in detail.task_instances} == {"success"}
    assert len(detail.results) == 200
    assert scheduler.poll() is None, "the scheduler exited after losing its connections"
    assert worker.poll() is None, "the worker exited after losing its connections"
