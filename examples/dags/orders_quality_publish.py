"""Orders: stage -> quality gate -> publish by atomic pointer swap.

`stage` writes the day's orders to a staging file; `check_orders` is a quality gate with two
BLOCKER checks (some rows; no negative amount) and one WARN check (few late rows). When a blocker
fails the gate fails at once (never retried), its dataset event `warehouse.orders_checked` is
recorded with quality `failed` (consumers are not triggered by it), and `publish` never runs.
Otherwise `publish` copies the staged file to an immutable version and swaps the `CURRENT`
pointer atomically (`os.replace`): readers see the old version or the new one, never half of it.

Try it: `treadle dags trigger orders_quality_publish` (green), then
`treadle dags trigger orders_quality_publish --conf '{"negative_amounts": 3}'` (the gate fails;
`treadle runs show RUN_ID --json` shows the quality result).
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path
from typing import Any

from treadle import Check, Dataset, Param, TaskContext, dag, quality_gate, task


def _warehouse() -> Path:
    return Path(os.environ.get("TREADLE_HOME", "~/.treadle")).expanduser() / "warehouse" / "orders"


@task(retries=2, retry_delay=1)
def stage(context: TaskContext) -> dict[str, Any]:
    """Write the day's orders (synthetic) to a staging file; params inject bad rows."""
    folder = _warehouse() / "staging"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{context.run_id}.csv"
    rows = [{"order_id": i, "amount": 10.0 + i, "late": i < context.params["late_rows"]} for i in range(50)]
    for i in range(context.params["negative_amounts"]):
        rows[i]["amount"] = -1.0
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["order_id", "amount", "late"])
        writer.writeheader()
        writer.writerows(rows)
    return {"path": str(path)}


@quality_gate(outlets=[Dataset("warehouse.orders_checked")])
def check_orders(staged: dict[str, Any]) -> list[Check]:
    """BLOCKER: rows present, no negative amount. WARN: fewer than 5 late rows."""
    with Path(staged["path"]).open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    negative = sum(1 for r in rows if float(r["amount"]) < 0)
    late = sum(1 for r in rows if r["late"] == "True")
    return [
        Check("row_count", passed=len(rows) > 0, observed=len(rows), expected="> 0"),
        Check("negative_amounts", passed=negative == 0, observed=negative, expected=0),
        Check("late_rows", passed=late < 5, severity="WARN", observed=late, expected="< 5"),
    ]


@task(retries=2, retry_delay=1, outlets=[Dataset("warehouse.orders")])
def publish(staged: dict[str, Any], quality: dict[str, Any], context: TaskContext) -> dict[str, Any]:
    """Copy the staged file to an immutable version, then swap the CURRENT pointer atomically."""
    versions = _warehouse() / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    version = versions / f"{context.run_id}.csv"
    shutil.copyfile(staged["path"], version)
    pointer = _warehouse() / "CURRENT"
    tmp = pointer.with_name(f".CURRENT.{os.getpid()}")
    tmp.write_text(str(version))
    os.replace(tmp, pointer)  # atomic on POSIX: readers see the old version or the new one
    context.outlet_event("warehouse.orders", version=context.run_id, metadata={"quality": quality["state"]})
    return {"current": str(version), "quality": quality["state"]}


@dag(
    dag_id="orders_quality_publish",
    owner="data-platform",
    tags=["example", "quality"],
    description="Stage orders, check their quality, publish by atomic pointer swap.",
    params={
        "negative_amounts": Param(0, type="integer", minimum=0, maximum=50, description="bad rows to inject"),
        "late_rows": Param(0, type="integer", minimum=0, maximum=50, description="late rows to inject"),
    },
)
def orders_quality_publish() -> None:
    staged = stage()
    publish(staged, check_orders(staged))
