"""`runs show` lists a run's task instances in the DAG's topological order, ties by task id."""

from __future__ import annotations

from treadle import dag, task
from treadle.engine import queries
from treadle.engine.dags import sync_dags
from treadle.engine.runs import trigger_run
from treadle.store.database import Database


@task
def zeta() -> int:
    return 1


@task
def alpha(x: int) -> int:
    return x


@task
def beta() -> int:
    return 2


@task
def omega(x: int, y: int) -> int:
    return x + y


@dag(dag_id="ordered")
def ordered() -> None:
    # Placed (and so inserted) in an order that is neither topological nor by id.
    last = omega
    z = zeta()
    b = beta()
    last(alpha(z), b)


def test_task_instances_come_in_topological_order_ties_by_id(sqlite_url: str) -> None:
    db = Database(sqlite_url)
    sync_dags(db, structures=[ordered.structure()], scanned_files=[], errors={})
    run = trigger_run(db, "ordered", triggered_by="test")

    detail = queries.run_detail(db, run.run_id)

    assert [t.task_id for t in detail.task_instances] == ["beta", "zeta", "alpha", "omega"]
    inserted = sorted(detail.task_instances, key=lambda t: t.id)
    assert [t.task_id for t in inserted] != ["beta", "zeta", "alpha", "omega"]
    db.dispose()
