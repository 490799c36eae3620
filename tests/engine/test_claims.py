"""Concurrent claimers (R7, F14): every claim honours its limit and no attempt is claimed twice."""

from __future__ import annotations

import threading
from collections import Counter

from tests.helpers.wait import wait_for
from treadle import dag, task
from treadle.domain.task_records import ClaimedTask
from treadle.engine import queries
from treadle.engine.execution import claim_task_instances, complete_attempts
from treadle.engine.runs import finish_idle_runs
from treadle.store.database import Database
from treadle.testing import DagRunner

TASKS, CLAIMERS, BATCH = 400, 8, 5


@task
def noop(n: int) -> int:
    return n


@dag(dag_id="fan")
def fan() -> None:
    for n in range(TASKS):
        noop(n)


def test_concurrent_claimers_never_share_an_attempt(db_url: str) -> None:
    runner = DagRunner(fan, database_url=db_url)
    run_id = runner.trigger()
    claimed: list[ClaimedTask] = []
    batch_sizes: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        db = Database(db_url)
        try:
            while True:
                got = claim_task_instances(
                    db, worker_id=f"w{n}", hostname="h", queues=["default"], limit=BATCH, lease_s=60
                )
                if not got:
                    return
                complete_attempts(db, [(t, t.task_id) for t in got], worker_id=f"w{n}", hostname="h")
                with lock:
                    claimed.extend(got)
                    batch_sizes.append(len(got))
        except BaseException as exc:
            errors.append(exc)
        finally:
            db.dispose()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    assert max(batch_sizes) <= BATCH
    counts = Counter((t.task_instance_id, t.attempt) for t in claimed)
    assert len(counts) == TASKS and set(counts.values()) == {1}
    assert {t.attempt for t in claimed} == {1}
    finished = wait_for(
        lambda: runner.result(run_id) if _closed(runner, run_id) else None,
        timeout=30,
        message="the run to close",
    )
    assert set(finished.task_states.values()) == {"success"}
    runner.close()


def _closed(runner: DagRunner, run_id: str) -> bool:
    finish_idle_runs(runner.db)
    return queries.run_detail(runner.db, run_id).run.state == "success"
