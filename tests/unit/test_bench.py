"""`treadle bench` chooses workloads by name and refuses what it cannot measure."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from treadle.bench.runner import BenchOptions, _database, selected


def test_workloads_are_chosen_by_short_or_full_name_in_bench_order() -> None:
    chosen = selected(BenchOptions(only=("independent", "chain-100")))
    assert [w.name for w in chosen] == ["chain-100", "independent-2000"]
    assert [w.name for w in selected(BenchOptions())] == [
        "chain-100",
        "fanout-500",
        "independent-2000",
        "run-10000",
    ]


def test_an_unknown_workload_is_named_with_the_choices() -> None:
    with pytest.raises(
        ValueError, match=r"unknown workload nope: choose from chain, fanout, independent, run"
    ):
        selected(BenchOptions(only=("nope",)))


def test_only_postgresql_or_sqlite_is_measured(tmp_path: Path) -> None:
    with ExitStack() as stack:
        assert _database(stack, BenchOptions(), tmp_path) == f"sqlite:///{tmp_path / 'bench.db'}"
        with pytest.raises(ValueError, match="PostgreSQL or SQLite, not mysql"):
            _database(stack, BenchOptions(database="mysql://root@127.0.0.1/test"), tmp_path)
