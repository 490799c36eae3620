"""Rolling restarts of workers lose nothing: each worker in turn is stopped with SIGTERM and
replaced while a run drains; every task ends success exactly once and no attempt is `lost`."""

from __future__ import annotations

import collections
import signal
from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

ROLLING_DAG = """
    from __future__ import annotations

    import random
    import time

    from treadle import dag, task


    @task(retries=0)
    def step(n: int) -> int:
        time.sleep(random.uniform(0.05, 0.3))
        return n


    @dag(dag_id="rolling")
    def rolling() -> None:
        for n in range(__COUNT__):
            step(n)
"""


def test_rolling_restart_loses_nothing(pg_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(pg_url, TREADLE_SHUTDOWN_GRACE_SECONDS="5")
    c.write_dag("rolling.py", ROLLING_DAG, count=150)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("a", concurrency=3)
    c.worker("b", concurrency=3)
    run_id = c.trigger("rolling")

    def done_count() -> int:
        return sum(t.state == "success" for t in c.detail(run_id).task_instances)

    for round_, name in enumerate(["a", "b", "a", "b"], start=1):
        wait_for(
            lambda r=round_: done_count() >= 20 * r, timeout=60, message=f"progress before restart {round_}"
        )
        proc = c.procs[name]
        c.signal(name, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # a drain, not a crash
        starts = c.log(name).count('"worker.started"')
        c.worker(name, concurrency=3)
        # Up (its signal handlers in place) before a later round may signal it.
        c.wait_started(name, after=starts)

    detail = c.wait_run(run_id, timeout=120)
    assert detail.run.state == "success"
    assert {t.state for t in detail.task_instances} == {"success"}
    outcomes = collections.Counter(a.outcome for a in detail.attempts)
    assert outcomes["lost"] == 0 and outcomes["failed"] == 0
    assert outcomes["success"] == 150
    per_task = collections.Counter(a.task_id for a in detail.attempts if a.outcome == "success")
    assert set(per_task.values()) == {1}


def test_sigterm_while_a_worker_starts_its_task_processes_is_a_clean_stop(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    """The group signal reaches task processes still starting (before they have their own
    group); the worker spawns them again and then stops as asked, exit 0, instead of crashing."""
    c = cluster(pg_url)
    c.write_dag("rolling.py", ROLLING_DAG, count=3)
    proc = c.worker("w", concurrency=8)
    wait_for(lambda: "dags synced" in c.log("w"), timeout=60, interval=0.01, message="the worker to sync")
    c.signal("w", signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, c.log("w")
    assert "worker stopped" in c.log("w")
