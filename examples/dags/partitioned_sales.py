"""Per-partition processing with dynamic task mapping.

`discover` lists the day's partitions (one per store; the param `stores` sets how many);
`load_partition` is mapped over them, one instance per partition (`load_partition[0]`,
`load_partition[1]`... in `treadle runs show`), at most four running at once
(`max_active_mapped=4`); `summarize` receives every instance's result, in partition order, and
adds them up. A list longer than `max_map_length` fails `discover`'s consumer at once with a
message naming the cap.

Try it: `treadle dags trigger partitioned_sales --conf '{"stores": 40}'`.
"""

from __future__ import annotations

from typing import Any

from treadle import Param, TaskContext, dag, task


@task
def discover(context: TaskContext) -> list[str]:
    """The partitions of the run's day: one per store."""
    day = context.logical_date.date().isoformat()
    return [f"sales/day={day}/store={n:03d}" for n in range(context.params["stores"])]


@task(retries=2, retry_delay=1, max_active_mapped=4, max_map_length=500)
def load_partition(partition: str, context: TaskContext) -> dict[str, Any]:
    """Load one partition (synthetic figures derived from its name)."""
    store = int(partition.rsplit("=", 1)[1])
    return {
        "partition": partition,
        "index": context.map_index,
        "rows": 100 + store,
        "amount": 10.5 * (store + 1),
    }


@task
def summarize(loaded: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals across partitions (the list comes in partition order)."""
    return {
        "partitions": len(loaded),
        "rows": sum(p["rows"] for p in loaded),
        "amount": round(sum(p["amount"] for p in loaded), 2),
    }


@dag(
    dag_id="partitioned_sales",
    owner="data-platform",
    tags=["example", "mapping"],
    description="Load each store's partition in parallel, then summarize.",
    params={"stores": Param(12, type="integer", minimum=0, maximum=500, description="partitions to load")},
)
def partitioned_sales() -> None:
    summarize(load_partition.expand(partition=discover()))
