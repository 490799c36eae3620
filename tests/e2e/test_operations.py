"""Production boundaries with real processes: graceful drain, cancellation, pools under six
competing workers, bounded admission, and the `why` / `queues` / `workers` views."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.store.tables import task_instances as ti

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SLEEPY_DAG = """
    from __future__ import annotations

    import time

    from treadle import dag, task


    @task(retries=0)
    def quick() -> str:
        time.sleep(1.5)
        return "quick"


    @task(retries=0)
    def slow() -> str:
        time.sleep(__SLOW__)
        return "slow"


    @task
    def after(value: str) -> str:
        return value


    @dag(dag_id="sleepy")
    def sleepy() -> None:
        quick()
        after(slow())
"""


def _task(c: Cluster, run_id: str, task_id: str) -> object:
    return next(t for t in c.detail(run_id).task_instances if t.task_id == task_id)


def test_sigterm_drains_then_hands_back_without_spending_a_retry(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url, TREADLE_SHUTDOWN_GRACE_SECONDS="4")
    c.write_dag("sleepy.py", SLEEPY_DAG, slow=30)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    first = c.worker("w1", concurrency=2)
    run_id = c.trigger("sleepy")
    wait_for(
        lambda: {t.state for t in c.detail(run_id).task_instances if t.task_id != "after"} == {"running"},
        timeout=30,
        message="both tasks to run",
    )

    c.signal("w1", signal.SIGTERM)
    first.wait(timeout=30)

    detail = c.detail(run_id)
    states = {t.task_id: t.state for t in detail.task_instances}
    assert states["quick"] == "success"  # finished within the grace period
    assert states["slow"] == "queued"  # handed back, not lost, not failed
    [handed] = [a for a in detail.attempts if a.task_id == "slow"]
    assert (handed.outcome, handed.error_type) == ("rejected", "WorkerShutdown")
    assert first.returncode == 0

    # The next worker runs it; retries=0 still allows it because no retry was spent.
    c.write_dag("sleepy.py", SLEEPY_DAG, slow=0.1)
    c.worker("w2", concurrency=2)
    done = c.wait_run(run_id, timeout=60)
    assert done.run.state == "success"
    slow_attempts = [a for a in done.attempts if a.task_id == "slow"]
    assert [(a.attempt, a.outcome) for a in slow_attempts] == [(1, "rejected"), (2, "success")]


def test_cancel_kills_a_running_attempt_and_nothing_downstream_starts(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url)
    c.write_dag("sleepy.py", SLEEPY_DAG, slow=60)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("w1", concurrency=2)
    run_id = c.trigger("sleepy")
    wait_for(
        lambda: _task(c, run_id, "slow").state == "running",
        timeout=30,  # type: ignore[attr-defined]
        message="slow to run",
    )

    out = c.cli_json("runs", "cancel", run_id, "--reason", "wrong input file")
    assert set(out["cancelled"]) >= {"slow", "after"}
    assert "slow" in out["running_killed"]

    detail = c.wait_run(run_id, timeout=30)
    assert detail.run.state == "cancelled"
    assert {t.task_id: t.state for t in detail.task_instances}["after"] == "cancelled"
    [attempt] = [a for a in detail.attempts if a.task_id == "slow"]
    assert attempt.outcome == "cancelled"
    assert "cancelled by cli:" in (attempt.error_message or "") and "wrong input file" in (
        attempt.error_message or ""
    )
    # The worker killed the attempt: its process reports nothing and is free again.
    wait_for(lambda: c.cli_json("workers")[0]["active"] == 0, timeout=15, message="the slot to be released")


POOL_DAG = """
    from __future__ import annotations

    import time

    from treadle import dag, task


    @task(pool="warehouse", retries=0)
    def load(n: int) -> int:
        time.sleep(0.05)
        return n


    @dag(dag_id="pooled")
    def pooled() -> None:
        for n in range(60):
            load(n)
"""


def test_pool_of_three_is_never_exceeded_by_six_workers(pg_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(pg_url)
    c.write_dag("pooled.py", POOL_DAG)
    assert c.cli("dags", "sync").returncode == 0
    assert c.cli("pools", "set", "warehouse", "3", "--description", "3 connections").returncode == 0
    c.start("scheduler", "scheduler")
    for n in range(6):
        c.worker(f"w{n}", concurrency=2)
    run_id = c.trigger("pooled")
    peak, samples = 0, 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak, samples
        while not stop.is_set():
            with c.db.read() as conn:
                used = conn.execute(
                    sa.select(sa.func.coalesce(sa.func.sum(ti.c.pool_slots), 0)).where(
                        ti.c.pool == "warehouse", ti.c.state == "running"
                    )
                ).scalar_one()
            peak, samples = max(peak, int(used)), samples + 1
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        detail = c.wait_run(run_id, timeout=120)
    finally:
        stop.set()
        sampler.join()
    assert detail.run.state == "success"
    assert samples > 20
    assert 2 <= peak <= 3  # contended (it filled up), never exceeded
    # Shared: the pass that frees a pool slot may take it again in the same transaction (record,
    # then claim), so one worker can keep a slot, but no worker holds the whole pool.
    assert len({a.worker_id for a in detail.attempts}) >= 2
    pools = c.cli_json("pools", "list")
    assert pools == [pools[0]] and pools[0]["name"] == "warehouse" and pools[0]["used_slots"] == 0


WIDE_DAG = """
    from __future__ import annotations

    import time

    from treadle import dag, task


    @task
    def hold(n: int) -> int:
        time.sleep(60)  # long enough that the counts below cannot move while the test reads them
        return n


    @task(queue="gpu", queue_timeout=30, retries=0)  # outlasts the reads below on a busy machine
    def elsewhere() -> None:
        return None


    @dag(dag_id="wide")
    def wide() -> None:
        for n in range(8):
            hold(n)
        elsewhere()
"""


def test_bounded_admission_and_the_operational_views(pg_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(pg_url, TREADLE_HEARTBEAT_SECONDS="1", TREADLE_LEASE_SECONDS="5")
    c.write_dag("wide.py", WIDE_DAG)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "2", "--prefetch", "1")
    run_id = c.trigger("wide")

    def loaded() -> dict | None:  # type: ignore[type-arg]
        workers = c.cli_json("workers")
        return workers[0] if workers and workers[0]["active"] == 2 and workers[0]["prefetched"] == 1 else None

    worker = wait_for(loaded, timeout=30, message="two running and one prefetched")
    assert (worker["concurrency"], worker["prefetch"]) == (2, 1)
    with c.db.read() as conn:
        running = conn.execute(sa.select(sa.func.count()).where(ti.c.state == "running")).scalar_one()
    assert running == 3  # 2 in slots + 1 prefetched hold leases; never more (no task ends for 60 s)

    queues = {q["queue"]: q for q in c.cli_json("queues")}
    assert queues["default"]["queued"] == 5 and queues["default"]["workers"]
    assert queues["gpu"]["queued"] == 1 and queues["gpu"]["workers"] == []
    why = {w["task_id"]: w["reason"] for w in c.cli_json("why", run_id)}
    assert why["elsewhere"] == "no live worker serves queue 'gpu'"
    assert any("busy" in r for t, r in why.items() if t.startswith("hold") and "running" not in r)
    shown = c.cli("why", run_id, "elsewhere")
    assert shown.returncode == 0 and "no live worker serves queue 'gpu'" in shown.stdout

    # Its dispatch deadline passes: the attempt ends dispatch_timeout with that reason.
    def stranded() -> object:
        return next((a for a in c.detail(run_id).attempts if a.task_id == "elsewhere"), None)

    attempt = wait_for(stranded, timeout=90, message="the dispatch deadline to pass")
    assert attempt.outcome == "dispatch_timeout"  # type: ignore[attr-defined]
    assert "no live worker serves queue 'gpu'" in attempt.error_message  # type: ignore[attr-defined]
