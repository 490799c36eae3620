"""The web grid's reads on every dialect, one row per run: the plain task instances' states, the
mapped instances' counts by state, and each task's longest successful attempt per run (a mapped
task's slowest instance)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Connection

from tests.web.dags_for_web import MARKER_ENV, web_pipeline
from treadle.engine.clearing import clear_tasks
from treadle.store import grid
from treadle.testing import DagRunner


def test_run_cells_mapped_counts_and_success_seconds_of_several_runs(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "feed-is-back"
    marker.touch()
    monkeypatch.setenv(MARKER_ENV, str(marker))
    runner = DagRunner(web_pipeline, database_url=db_url)
    try:
        done = runner.trigger({"limit": 3})
        assert runner.run_until_done(done).state == "success"
        waiting = runner.trigger({"limit": 1})
        cells = runner.db.query(lambda conn: grid.run_cells(conn, [done, waiting, "no_such_run"]))
        assert set(cells) == {done, waiting}
        assert sorted(zip(cells[waiting].task_ids, cells[waiting].states, strict=True)) == [
            ("extract", "queued"),
            ("flaky", "pending"),
            ("publish", "pending"),
            ("square", "pending"),
        ]
        assert cells[waiting].mapped == 0
        # The mapped task expanded: its instances are counted apart, not as plain cells.
        assert sorted(zip(cells[done].task_ids, cells[done].states, strict=True)) == [
            ("extract", "success"),
            ("flaky", "success"),
            ("publish", "success"),
        ]
        assert cells[done].mapped == 3
        counts = runner.db.query(lambda conn: grid.mapped_counts(conn, [done, waiting]))
        assert counts == [(done, "square", "success", 3)]
        seconds = runner.db.query(lambda conn: grid.success_seconds(conn, [done, waiting]))
        assert set(seconds) == {done}
        assert set(seconds[done]) == {"extract", "square", "flaky", "publish"}
        slowest = max(a.duration_s or 0.0 for a in runner.result(done).attempts("square"))
        assert seconds[done]["square"] == pytest.approx(slowest)
        (extract,) = runner.result(done).attempts("extract")
        assert seconds[done]["extract"] == pytest.approx(extract.duration_s or 0.0)
        assert runner.db.query(lambda conn: grid.run_cells(conn, [])) == {}
        assert runner.db.query(lambda conn: grid.mapped_counts(conn, [])) == []
        assert runner.db.query(lambda conn: grid.success_seconds(conn, [])) == {}
    finally:
        runner.close()


def test_a_mapped_task_folded_by_a_clear_is_one_plain_cell(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clearing a mapped task's upstream folds its instances back into one row and retires the
    rest (skipped, at map_index below -1): the cell is the folded row's state."""
    marker = tmp_path / "feed-is-back"
    marker.touch()
    monkeypatch.setenv(MARKER_ENV, str(marker))
    runner = DagRunner(web_pipeline, database_url=db_url)
    try:
        done = runner.trigger({"limit": 3})
        assert runner.run_until_done(done).state == "success"
        clear_tasks(runner.db, done, ["extract"], downstream=True, actor="tester", reason="rerun")
        cells = runner.db.query(lambda conn: grid.run_cells(conn, [done]))[done]
        states = dict(zip(cells.task_ids, cells.states, strict=True))
        assert sorted(cells.task_ids) == ["extract", "flaky", "publish", "square"]
        assert states["extract"] == "queued"
        assert states["square"] == "pending"
        assert cells.mapped == 0
        assert runner.db.query(lambda conn: grid.mapped_counts(conn, [done])) == []
    finally:
        runner.close()


@pytest.mark.mysql
def test_a_cut_short_aggregate_is_read_row_by_row(
    mysql_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MariaDB cuts group_concat at group_concat_max_len (1 MB by default, but a server may set
    less): the reads notice the missing pairs and read that run's rows instead."""
    marker = tmp_path / "feed-is-back"
    marker.touch()
    monkeypatch.setenv(MARKER_ENV, str(marker))
    runner = DagRunner(web_pipeline, database_url=mysql_url)
    try:
        done = runner.trigger({"limit": 2})
        assert runner.run_until_done(done).state == "success"

        def short(conn: Connection) -> tuple[grid.RunCells, dict[str, dict[str, float]]]:
            conn.exec_driver_sql("SET SESSION group_concat_max_len = 8")
            try:
                return grid.run_cells(conn, [done])[done], grid.success_seconds(conn, [done])
            finally:
                conn.exec_driver_sql("SET SESSION group_concat_max_len = DEFAULT")

        cells, seconds = runner.db.query(short)
        assert sorted(cells.task_ids) == ["extract", "flaky", "publish"]
        assert set(cells.states) == {"success"}
        assert set(seconds[done]) == {"extract", "square", "flaky", "publish"}
        slowest = max(a.duration_s or 0.0 for a in runner.result(done).attempts("square"))
        assert seconds[done]["square"] == pytest.approx(slowest)
    finally:
        runner.close()
