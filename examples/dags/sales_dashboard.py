"""Sales dashboard: refreshed whenever the daily sales report has published new data.

Scheduled on the dataset `warehouse.sales_daily`: a run starts once the dataset has a new
event; several events that arrive before it starts are consumed by one run, listed in the
run manifest (`consumed_dataset_events`).
"""

from __future__ import annotations

from typing import Any

from treadle import Dataset, TaskContext, dag, task


@task(retries=2, retry_delay=5)
def refresh(context: TaskContext) -> dict[str, Any]:
    """Rebuild the dashboard from the reports the consumed events point at."""
    events = context.manifest.get("consumed_dataset_events", [])
    return {"refreshed_from_runs": sorted({e.get("run_id") for e in events if e.get("run_id")})}


@dag(
    dag_id="sales_dashboard",
    owner="analytics",
    tags=["example", "sales"],
    schedule=[Dataset("warehouse.sales_daily")],
)
def sales_dashboard() -> None:
    refresh()
