"""OpenLineage end to end: a real scheduler and worker with TREADLE_OPENLINEAGE_FILE set; the
leading scheduler's relay appends the run's events, in order, to the file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DAG = """
    from treadle import Dataset, dag, task


    @task(outlets=[Dataset("warehouse.orders")])
    def load() -> int:
        return 1


    @dag(dag_id="shipping", inlets=[Dataset("lake.orders")])
    def shipping() -> None:
        load()


    shipping()
"""


def test_a_runs_lineage_reaches_the_file_in_order(tmp_path: Path, cluster: Callable[..., Cluster]) -> None:
    path = tmp_path / "lineage.jsonl"
    c = cluster(
        f"sqlite:///{tmp_path / 'lineage.db'}",
        TREADLE_OPENLINEAGE_FILE=str(path),
        TREADLE_OPENLINEAGE_NAMESPACE="e2e",
    )
    c.write_dag("shipping.py", DAG)
    assert c.cli("db", "upgrade").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("worker")
    c.wait_dag("shipping")
    c.wait_run(c.trigger("shipping"))

    def events() -> list[dict[str, Any]]:
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines] if len(lines) >= 4 else []

    found = wait_for(events, timeout=60, message="the run's four lineage events in the file")
    assert [(e["job"]["namespace"], e["job"]["name"], e["eventType"]) for e in found] == [
        ("e2e", "shipping", "START"),
        ("e2e", "shipping.load", "START"),
        ("e2e", "shipping.load", "COMPLETE"),
        ("e2e", "shipping", "COMPLETE"),
    ]
    assert [d["name"] for d in found[0]["inputs"]] == ["lake.orders"]
    assert [d["name"] for d in found[2]["outputs"]] == ["warehouse.orders"]
