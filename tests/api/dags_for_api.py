"""DAGs the API tests register: one per team, one that always fails (for dead letters)."""

from __future__ import annotations

from treadle import Param, dag, task


@task
def step() -> int:
    return 1


@task(retries=0)
def broken() -> int:
    raise ValueError("this task always fails")


@dag(dag_id="fin_report", team="finance", params={"limit": Param(10, type="integer", minimum=1)})
def fin_report() -> None:
    step()


@dag(dag_id="fin_broken", team="finance")
def fin_broken() -> None:
    broken()


@dag(dag_id="ops_daily", schedule="0 2 * * *", start_date="2026-01-01")
def ops_daily() -> None:
    step()
