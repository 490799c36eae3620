"""DAGs used by the engine tests (built in-process; the testing runner executes them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from treadle import TaskContext, dag, task


@task
def extract() -> list[int]:
    return [1, 2, 3, 4]


@task(retries=1, retry_delay=0)
def transform(rows: list[int]) -> dict[str, int]:
    return {"total": sum(rows), "count": len(rows)}


@task
def load(summary: dict[str, int], context: TaskContext) -> dict[str, Any]:
    return {"loaded": summary["total"], "from": sorted(context.upstream_results)}


@task
def notify(loaded: dict[str, Any]) -> str:
    return f"loaded {loaded['loaded']}"


@dag(dag_id="four_steps")
def four_steps() -> None:
    notify(load(transform(extract())))


@task(retries=3, retry_delay=0.2, backoff_factor=2.0, jitter=0.5, max_retry_delay=10)
def flaky(context: TaskContext) -> int:
    if context.attempt < 3:
        raise ConnectionError(f"upstream refused connection on attempt {context.attempt}")
    return context.attempt


@dag(dag_id="flaky_dag")
def flaky_dag() -> None:
    flaky()


def make_failing_dag(flag_file: Path) -> Any:
    """A DAG whose `fragile` task fails until `flag_file` exists."""

    @task(retries=1, retry_delay=0)
    def fragile() -> str:
        if not flag_file.exists():
            raise ValueError(f"missing input file {flag_file}")
        return "fixed"

    @task
    def after(value: str) -> str:
        return value + "!"

    @task
    def last(value: str) -> str:
        return value + "!"

    @task
    def independent() -> int:
        return 1

    @dag(dag_id="failing_dag")
    def failing_dag() -> None:
        last(after(fragile()))
        independent()

    return failing_dag
