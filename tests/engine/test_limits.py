"""Pools and DAG max_active_tasks are never exceeded, however many claimers race (F15)."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from treadle import dag, task
from treadle.engine import diagnosis
from treadle.engine.execution import claim_task_instances, complete_attempts
from treadle.engine.pools import set_pool
from treadle.engine.workers import record_worker
from treadle.store.database import Database
from treadle.store.tables import dags
from treadle.store.tables import task_instances as ti
from treadle.testing import DagRunner


@task(pool="db", retries=0)
def pooled(n: int) -> int:
    return n


@task(pool="db", pool_slots=3)
def greedy() -> None:
    return None


@task(pool="missing")
def orphan() -> None:
    return None


@task
def free(n: int) -> int:
    return n


@dag(dag_id="pooled_dag")
def pooled_dag() -> None:
    for n in range(6):
        pooled(n)
    greedy()
    orphan()
    free(0)


@dag(dag_id="limited", max_active_tasks=2)
def limited() -> None:
    for n in range(5):
        free(n)


def _claim(db: Database, worker: str, limit: int = 50) -> list:  # type: ignore[type-arg]
    return claim_task_instances(
        db, worker_id=worker, hostname="h", queues=["default"], limit=limit, lease_s=60
    )


def test_pool_slots_and_missing_or_too_small_pools(db_url: str) -> None:
    runner = DagRunner(pooled_dag, database_url=db_url)
    try:
        set_pool(runner.db, "db", slots=2, description="warehouse connections", actor="test")
        run_id = runner.trigger()
        first = _claim(runner.db, "w1")
        assert sorted(t.task_id for t in first if t.task_id.startswith("pooled")) == ["pooled", "pooled__1"]
        assert "free" in {t.task_id for t in first}
        assert not {"greedy", "orphan"} & {t.task_id for t in first}
        assert _claim(runner.db, "w2") == []  # the pool is full

        done = [t for t in first if t.task_id == "pooled"]
        complete_attempts(runner.db, [(t, 0) for t in done], worker_id="w1", hostname="h")
        assert [t.task_id for t in _claim(runner.db, "w2")] == ["pooled__2"]

        record_worker(runner.db, worker_id="w1", hostname="h", pid=1, queues=["default"], concurrency=8)
        reasons = {w.task_id: w for w in diagnosis.why(runner.db, run_id, worker_stale_s=60)}
        assert "does not exist" in reasons["orphan"].reason
        assert "needs 3 slot(s) of pool 'db', which has only 2" in reasons["greedy"].reason
        assert "pool 'db' is full (2/2 slots in use)" in reasons["pooled__3"].reason
        assert len(reasons["pooled__3"].held_by) == 2
    finally:
        runner.close()


def test_dag_max_active_tasks(db_url: str) -> None:
    runner = DagRunner(limited, database_url=db_url)
    try:
        runner.trigger()
        runner.trigger()
        assert len(_claim(runner.db, "w1")) == 2  # across both runs of the DAG
        assert _claim(runner.db, "w2") == []
    finally:
        runner.close()


def test_dag_limit_holds_while_another_transaction_locks_the_dag_row(db_url: str) -> None:
    # On MariaDB a claim that joined `dags` under SKIP LOCKED would null-extend a locked DAG
    # row and read "no limit"; the claim must read the limit and wait for the row instead.
    runner = DagRunner(limited, database_url=db_url)
    holder = Database(db_url)
    claimed: list = []  # type: ignore[type-arg]
    try:
        runner.trigger()
        with holder.begin() as conn:
            conn.execute(sa.select(dags.c.dag_id).where(dags.c.dag_id == "limited").with_for_update())
            claimer = threading.Thread(target=lambda: claimed.extend(_claim(runner.db, "w1")))
            claimer.start()
            claimer.join(timeout=0.5)  # holds the row while the claim runs into it
        claimer.join(timeout=60)
        assert len(claimed) == 2
    finally:
        holder.dispose()
        runner.close()


def test_racing_claimers_never_exceed_a_pool(db_url: str) -> None:
    runner = DagRunner(pooled_dag, database_url=db_url)
    set_pool(runner.db, "db", slots=3, description=None, actor="test")
    for _ in range(5):
        runner.trigger()
    peak = 0
    stop = threading.Event()
    errors: list[BaseException] = []

    def sample() -> None:
        nonlocal peak
        db = Database(db_url)
        while not stop.is_set():
            with db.read() as conn:
                used = conn.execute(
                    sa.select(sa.func.coalesce(sa.func.sum(ti.c.pool_slots), 0)).where(
                        ti.c.pool == "db", ti.c.state == "running"
                    )
                ).scalar_one()
            peak = max(peak, int(used))
        db.dispose()

    def claimer(n: int) -> None:
        db = Database(db_url)
        try:
            for _ in range(40):
                got = _claim(db, f"w{n}", limit=3)
                time.sleep(0.005)
                complete_attempts(db, [(t, 0) for t in got], worker_id=f"w{n}", hostname="h")
        except BaseException as exc:
            errors.append(exc)
        finally:
            db.dispose()

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    sampler.join()
    runner.close()

    assert errors == []
    assert 0 < peak <= 3


def test_why_names_a_dag_file_that_fails_to_load_on_the_workers(db_url: str) -> None:
    from treadle.engine.dags import sync_dags
    from treadle.store.tables import dags as dags_table

    runner = DagRunner(limited, database_url=db_url)
    try:
        run_id = runner.trigger()
        record_worker(runner.db, worker_id="w1", hostname="h", pid=1, queues=["default"], concurrency=8)
        with runner.db.begin() as conn:
            conn.execute(sa.update(dags_table).values(fileloc="/dags/limited.py"))
        sync_dags(
            runner.db,
            structures=[],
            scanned_files=["/dags/limited.py"],
            errors={"/dags/limited.py": ("DagImportTimeout: importing /dags/limited.py took longer", "")},
        )
        [waiting, *_] = diagnosis.why(runner.db, run_id, worker_stale_s=60)
        assert waiting.reason.startswith("its DAG file /dags/limited.py fails to load on the workers")
        assert "DagImportTimeout" in waiting.reason
    finally:
        runner.close()
