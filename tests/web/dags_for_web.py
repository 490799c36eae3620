"""The DAGs the web UI tests drive: params to trigger with, a mapped task, and a task that fails
until a marker file exists (to dead-letter it, then requeue it and see it succeed) or, when the
marker says `unknown`, ends with an unknown commit (to resolve it); and a scheduled DAG of
another team with a contract and an outlet."""

from __future__ import annotations

import os
from pathlib import Path

from treadle import Alert, Param, TaskContext, UnknownCommit, dag, task

#: The file whose presence lets `flaky` succeed (set by the test before it requeues).
MARKER_ENV = "TREADLE_WEB_TEST_MARKER"


@task
def extract(context: TaskContext) -> list[int]:
    print(f"extracting {context.params['limit']} rows")
    return list(range(3))


@task
def square(item: int) -> int:
    return item * item


@task(retries=0)
def flaky(values: list[int]) -> int:
    marker = os.environ.get(MARKER_ENV, "")
    print(f"checking the upstream feed, {len(values)} values")
    if not marker or not Path(marker).exists():
        raise ConnectionError("the upstream feed refused the connection")
    if Path(marker).read_text() == "unknown":
        raise UnknownCommit("the feed closed the connection after the write was sent")
    return sum(values)


@task
def publish(total: int) -> dict[str, int]:
    return {"total": total}


@dag(
    dag_id="web_pipeline",
    team="finance",
    owner="data-eng",
    tags=("web", "daily"),
    description="Extract, square each row, check the feed, publish.",
    params={"limit": Param(10, type="integer", minimum=1, description="rows to extract")},
)
def web_pipeline() -> None:
    rows = extract()
    publish(flaky(square.expand(item=rows)))


@task(outlets=("warehouse.cleanup_report",))
def sweep() -> int:
    return 0


@dag(
    dag_id="ops_cleanup",
    team="ops",
    owner="platform",
    schedule="0 3 * * *",
    start_date="2026-01-01",
    timezone="Europe/Berlin",
    tags=("maintenance",),
    purpose="Remove expired staging files every night.",
    criticality="low",
    freshness_slo="36h",
    published_by="05:00 Europe/Berlin",
    alerts=[Alert("consecutive_failures", count=2)],
    failure_impact="staging disk fills up within a week",
    runbook_url="https://runbooks.example.com/ops-cleanup",
)
def ops_cleanup() -> None:
    sweep()
