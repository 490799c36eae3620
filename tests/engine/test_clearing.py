"""Clearing task instances: finished tasks run again with a fresh budget, history kept, audited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.engine.dags_for_tests import four_steps, make_failing_dag
from treadle import dag, task
from treadle.engine import queries
from treadle.engine.clearing import clear_tasks
from treadle.engine.execution import claim_task_instances, complete_attempt
from treadle.errors import InvalidRequest, RunNotFound
from treadle.store.database import Database
from treadle.store.tables import audit_log, task_instances
from treadle.testing import DagRunner


def _audit(db: Database, action: str) -> list[Any]:
    with db.read() as conn:
        return list(
            conn.execute(sa.select(audit_log).where(audit_log.c.action == action).order_by(audit_log.c.id))
        )


def _instances(db: Database, run_id: str) -> dict[str, Any]:
    with db.read() as conn:
        rows = conn.execute(sa.select(task_instances).where(task_instances.c.run_id == run_id))
        return {r.task_id: r for r in rows}


def test_clear_dead_letter_with_downstream_reopens_the_run_and_it_succeeds(
    db_url: str, tmp_path: Path
) -> None:
    flag = tmp_path / "input.csv"
    runner = DagRunner(make_failing_dag(flag), database_url=db_url)
    try:
        run_id = runner.trigger()
        failed = runner.run_until_done(run_id)
        assert failed.state == "failed"
        assert failed.task_states["fragile"] == "dead_letter"
        assert failed.task_states["after"] == failed.task_states["last"] == "upstream_failed"

        report = clear_tasks(
            runner.db, run_id, ["fragile"], downstream=True, actor="cli:alice", reason="input file restored"
        )

        assert report.run_id == run_id
        assert report.cleared == ["fragile", "after", "last"]
        reopened = runner.result(run_id)
        assert reopened.state == "running"
        assert reopened.run.ended_at is None
        assert reopened.task_states == {
            "fragile": "queued",
            "after": "pending",
            "last": "pending",
            "independent": "success",
        }
        rows = _instances(runner.db, run_id)
        assert rows["fragile"].budget_base == rows["fragile"].attempt == 2
        assert rows["fragile"].dead_letter_reason is None
        assert rows["fragile"].queued_at is not None and rows["fragile"].dispatch_deadline is not None
        assert rows["fragile"].dispatch_deadline > rows["fragile"].queued_at
        assert rows["after"].upstream_done == 0 and rows["after"].ended_at is None
        # History is kept: the two failed attempts are still there.
        assert [a.outcome for a in reopened.attempts("fragile")] == ["failed", "failed"]

        # Fresh budget: with the input still missing it gets its two attempts again.
        again = runner.run_until_done(run_id)
        assert again.state == "failed"
        assert [a.attempt for a in again.attempts("fragile")] == [1, 2, 3, 4]

        clear_tasks(runner.db, run_id, ["fragile"], downstream=True, actor="cli:alice", reason="now really")
        flag.write_text("ok")
        fixed = runner.run_until_done(run_id)
        assert fixed.state == "success"
        assert fixed.results["last"] == "fixed!!"
        assert [a.attempt for a in fixed.attempts("fragile")] == [1, 2, 3, 4, 5]
        assert [a.outcome for a in fixed.attempts("independent")] == ["success"]

        entries = _audit(runner.db, "task.clear")
        assert len(entries) == 2
        first = entries[0]
        assert first.actor == "cli:alice"
        assert first.target == f"run:{run_id}"
        assert first.details["reason"] == "input file restored"
        assert first.details["tasks"] == ["fragile", "after", "last"]
        assert first.details["downstream"] is True
    finally:
        runner.close()


def test_clearing_an_active_instance_is_refused_and_changes_nothing(db_url: str) -> None:
    runner = DagRunner(four_steps, database_url=db_url)
    try:
        run_id = runner.trigger()
        before = _instances(runner.db, run_id)
        with pytest.raises(InvalidRequest, match=r"have not finished: extract \(queued\)"):
            clear_tasks(runner.db, run_id, ["extract"], downstream=True, actor="t", reason="")
        with pytest.raises(InvalidRequest, match=r"extract \(queued\)"):
            clear_tasks(runner.db, run_id, None, downstream=False, actor="t", reason="")
        after = _instances(runner.db, run_id)
        assert {k: (v.state, v.budget_base) for k, v in after.items()} == {
            k: (v.state, v.budget_base) for k, v in before.items()
        }
        assert _audit(runner.db, "task.clear") == []

        with pytest.raises(InvalidRequest, match="has no task 'nope'"):
            clear_tasks(runner.db, run_id, ["nope"], downstream=False, actor="t", reason="")
        with pytest.raises(RunNotFound):
            clear_tasks(runner.db, "no-such-run", ["extract"], downstream=False, actor="t", reason="")
    finally:
        runner.close()


def test_clear_successful_task_alone_reruns_it_and_keeps_the_rest(db_url: str) -> None:
    runner = DagRunner(four_steps, database_url=db_url)
    try:
        run_id = runner.trigger()
        assert runner.run_until_done(run_id).state == "success"

        report = clear_tasks(
            runner.db, run_id, ["transform"], downstream=False, actor="t", reason="recompute"
        )
        assert report.cleared == ["transform"]
        mid = runner.result(run_id)
        assert mid.state == "running"
        assert mid.task_states == {
            "extract": "success",
            "transform": "queued",
            "load": "success",
            "notify": "success",
        }
        done = runner.run_until_done(run_id)
        assert done.state == "success"
        assert [a.attempt for a in done.attempts("transform")] == [1, 2]
        assert [a.attempt for a in done.attempts("load")] == [1]
    finally:
        runner.close()


def test_a_task_whose_failed_upstream_is_not_cleared_is_refused(db_url: str, tmp_path: Path) -> None:
    runner = DagRunner(make_failing_dag(tmp_path / "missing"), database_url=db_url)
    try:
        run_id = runner.trigger()
        assert runner.run_until_done(run_id).state == "failed"
        with pytest.raises(
            InvalidRequest, match=r"'after' could never run: its upstream fragile \(dead_letter\)"
        ):
            clear_tasks(runner.db, run_id, ["after"], downstream=True, actor="t", reason="")
        assert runner.result(run_id).state == "failed"
        # only_failed over the whole run: the dead letter and everything it blocked.
        report = clear_tasks(runner.db, run_id, None, downstream=True, actor="t", reason="", only_failed=True)
        assert report.cleared == ["fragile", "after", "last"]
    finally:
        runner.close()


@task(queue="left")
def left() -> int:
    return 1


@task(queue="right")
def right() -> int:
    return 2


@task(queue="left")
def join(a: int, b: int) -> int:
    return a + b


@dag(dag_id="fan_in")
def fan_in() -> None:
    join(left(), right())


def _run_queue(db: Database, queue: str) -> list[str]:
    """Claim and complete whatever is queued on `queue` (no user code: results are None)."""
    claimed = claim_task_instances(db, worker_id="w", hostname="h", queues=[queue], limit=10, lease_s=60)
    for t in claimed:
        assert complete_attempt(db, t, worker_id="w", hostname="h", value=1).applied
    return [t.task_id for t in claimed]


def test_clearing_an_upstream_recounts_a_waiting_fan_in(db_url: str) -> None:
    runner = DagRunner(fan_in, database_url=db_url)
    try:
        run_id = runner.trigger()
        assert _run_queue(runner.db, "left") == ["left"]
        assert _instances(runner.db, run_id)["join"].upstream_done == 1

        # `left` runs again: `join` must not count its success twice.
        assert clear_tasks(runner.db, run_id, ["left"], downstream=False, actor="t", reason="").cleared == [
            "left"
        ]
        assert _instances(runner.db, run_id)["join"].upstream_done == 0
        assert _run_queue(runner.db, "left") == ["left"]
        states = {t.task_id: t.state for t in queries.run_detail(runner.db, run_id).task_instances}
        assert states == {"left": "success", "right": "queued", "join": "pending"}
        assert _run_queue(runner.db, "right") == ["right"]
        assert _run_queue(runner.db, "left") == ["join"]
    finally:
        runner.close()
