"""Daily sales report: extract -> transform -> load -> notify.

Each step has its own retry settings: the extract talks to a (simulated) flaky source and
retries quickly with backoff; the load writes a file and retries slower; notify never retries.
"""

from __future__ import annotations

import csv
import os
import random
from pathlib import Path
from typing import Any

from treadle import TaskContext, dag, task

REGIONS = ["north", "south", "east", "west"]


@task(retries=4, retry_delay=1, backoff_factor=2, max_retry_delay=30, jitter=0.2, timeout=60)
def extract(context: TaskContext) -> list[dict[str, Any]]:
    """Pull the day's orders from the source system (synthetic, seeded by the run)."""
    rng = random.Random(context.run_id)
    return [
        {"order_id": i, "region": rng.choice(REGIONS), "amount": round(rng.uniform(5, 500), 2)}
        for i in range(200)
    ]


@task(retries=1, retry_delay=5)
def transform(orders: list[dict[str, Any]]) -> dict[str, float]:
    """Total sales per region."""
    totals = dict.fromkeys(REGIONS, 0.0)
    for order in orders:
        totals[order["region"]] += order["amount"]
    return {region: round(total, 2) for region, total in totals.items()}


@task(retries=3, retry_delay=10, backoff_factor=3, max_retry_delay=300)
def load(totals: dict[str, float], context: TaskContext) -> dict[str, Any]:
    """Write the report as CSV under $TREADLE_HOME/reports."""
    folder = Path(os.environ.get("TREADLE_HOME", "~/.treadle")).expanduser() / "reports"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sales_{context.run_id}.csv"
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
)
def daily_sales_report() -> None:
    notify(load(transform(extract())))
