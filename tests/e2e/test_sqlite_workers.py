"""Several worker processes on one SQLite file: writers serialise, nobody sees "database is locked",
every task runs exactly once, and the file passes an integrity check afterwards (R7, SQLite)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

DAG = """
    from __future__ import annotations

    import os

    from treadle import TaskContext, dag, task

    EFFECTS = __EFFECTS__


    @task
    def effect(n: int, context: TaskContext) -> int:
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{context.task_id} {context.attempt}\\n".encode())
        finally:
            os.close(fd)
        return n


    @dag(dag_id="sqlite_many")
    def sqlite_many() -> None:
        for n in range(__COUNT__):
            effect(n)
"""


def test_three_workers_share_one_sqlite_file(sqlite_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(sqlite_url)
    effects = c.root / "effects.log"
    c.write_dag("many.py", DAG, effects=str(effects), count=300)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    for name in ("w1", "w2", "w3"):
        c.worker(name, concurrency=2)
    # Every worker is up before the trigger: otherwise the first one can finish the run alone.
    for name in ("w1", "w2", "w3"):
        c.wait_started(name)
    run_id = c.trigger("sqlite_many")

    detail = c.wait_run(run_id, timeout=120)

    assert detail.run.state == "success"
    assert {(t.state, t.attempt) for t in detail.task_instances} == {("success", 1)}
    lines = collections.Counter(effects.read_text().splitlines())
    assert len(lines) == 300 and set(lines.values()) == {1}
    assert len({a.worker_id for a in detail.attempts}) >= 2
    logs = "".join(c.log(n) for n in ("scheduler", "w1", "w2", "w3"))
    assert "database is locked" not in logs
    with c.db.read() as conn:
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
