"""Daily sales report: extract -> transform -> load -> notify.

Runs every day at 02:00 Singapore time for the day before: the run with logical date
2026-07-04 covers 2026-07-04 02:00 -> 2026-07-05 02:00 (Asia/Singapore) and fires at its end.
Each step has its own retry settings: the extract talks to a (simulated) flaky source and
retries quickly with backoff; the load writes a file and retries slower; notify never retries.
`min_amount` is a validated param; the load records an event on the dataset
`warehouse.sales_daily`, which the `sales_dashboard` example waits for.
"""

from __future__ import annotations

import csv
import os
import random
from pathlib import Path
from typing import Any

from treadle import Dataset, Param, TaskContext, dag, task

REGIONS = ["north", "south", "east", "west"]


@task(retries=4, retry_delay=1, backoff_factor=2, max_retry_delay=30, jitter=0.2, timeout=60)
def extract(context: TaskContext) -> list[dict[str, Any]]:
    """Pull the day's orders from the source system (synthetic, seeded by the run)."""
    rng = random.Random(context.run_id)
    orders = [
        {"order_id": i, "region": rng.choice(REGIONS), "amount": round(rng.uniform(5, 500), 2)}
        for i in range(200)
    ]
    return [o for o in orders if o["amount"] >= context.params["min_amount"]]


@task(retries=1, retry_delay=5)
def transform(orders: list[dict[str, Any]]) -> dict[str, float]:
    """Total sales per region."""
    totals = dict.fromkeys(REGIONS, 0.0)
    for order in orders:
        totals[order["region"]] += order["amount"]
    return {region: round(total, 2) for region, total in totals.items()}


@task(
    retries=3,
    retry_delay=10,
    backoff_factor=3,
    max_retry_delay=300,
    outlets=[Dataset("warehouse.sales_daily")],
)
def load(totals: dict[str, float], context: TaskContext) -> dict[str, Any]:
    """Write the report as CSV under $TREADLE_HOME/reports."""
    folder = Path(os.environ.get("TREADLE_HOME", "~/.treadle")).expanduser() / "reports"
    folder.mkdir(parents=True, exist_ok=True)
    day = context.manifest.get("data_interval_start", context.logical_date.isoformat())[:10]
    path = folder / f"sales_{day}_{context.run_id}.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["region", "total"])
        writer.writerows(sorted(totals.items()))
    return {"path": str(path), "grand_total": round(sum(totals.values()), 2)}


@task(retries=0)
def notify(report: dict[str, Any]) -> str:
    """Tell the team (here: the result shown in `treadle runs show`)."""
    return f"sales report ready: {report['path']} (total {report['grand_total']})"


@dag(
    dag_id="daily_sales_report",
    owner="analytics",
    tags=["example", "sales"],
    description="Aggregate the day's orders per region and publish a CSV report.",
    schedule="0 2 * * *",
    timezone="Asia/Singapore",
    params={"min_amount": Param(0, type="number", minimum=0, description="ignore smaller orders")},
    purpose="Daily sales per region for the regional managers' morning review",
    criticality="medium",
    freshness_slo="26h",
    failure_impact="regional managers review yesterday's figures",
    runbook_url="https://wiki.example.com/runbooks/daily-sales-report",
)
def daily_sales_report() -> None:
    notify(load(transform(extract())))
