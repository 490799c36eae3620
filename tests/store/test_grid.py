"""The web grid's two reads on every dialect: task states of several runs, and each task's
longest successful attempt per run (a mapped task's slowest instance)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.web.dags_for_web import MARKER_ENV, web_pipeline
from treadle.store import grid
from treadle.testing import DagRunner


def test_task_states_and_success_durations_of_several_runs(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "feed-is-back"
    marker.touch()
    monkeypatch.setenv(MARKER_ENV, str(marker))
    runner = DagRunner(web_pipeline, database_url=db_url)
    try:
        done = runner.trigger({"limit": 1})
        assert runner.run_until_done(done).state == "success"
        waiting = runner.trigger({"limit": 1})
        states = runner.db.query(lambda conn: grid.task_states(conn, [done, waiting]))
        # One row per run, task, mapped-or-not and state, with how many instances it counts.
        assert sorted((t, m, s, n) for r, t, m, s, n in states if r == waiting) == [
            ("extract", False, "queued", 1),
            ("flaky", False, "pending", 1),
            ("publish", False, "pending", 1),
            ("square", False, "pending", 1),
        ]
        finished = {(t, m, s): n for r, t, m, s, n in states if r == done}
        # The three mapped instances of `square` fold into one row that counts them.
        assert finished[("square", True, "success")] == 3
        assert finished[("extract", False, "success")] == 1
        assert {s for (t, m, s) in finished if m or t != "square"} == {"success"}
        seconds = runner.db.query(lambda conn: grid.success_durations(conn, [done, waiting]))
        assert set(seconds) == {(done, t) for t in ("extract", "square", "flaky", "publish")}
        slowest = max(a.duration_s or 0.0 for a in runner.result(done).attempts("square"))
        assert seconds[(done, "square")] == pytest.approx(slowest)
        assert runner.db.query(lambda conn: grid.task_states(conn, [])) == []
    finally:
        runner.close()
