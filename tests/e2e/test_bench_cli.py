"""`treadle bench` runs a workload end to end on fresh processes and reports it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]


def test_bench_measures_the_chain_on_sqlite_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "bench", "--only", "chain", "--reps", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["settings"]["database"] == "sqlite"
    chain = figures["workloads"]["chain-100"]
    assert chain["tasks"] == 100 and len(chain["treadle"]["walls_s"]) == 1
    assert chain["treadle"]["median_wall_s"] > 0
    assert "chain-100" in done.stdout  # the table
