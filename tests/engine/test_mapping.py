"""Dynamic task mapping through the engine, on every database: expansion, order of results, empty
and bad lists, caps, max_active_mapped, trigger rules on mapped tasks, requeue and clear."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.engine.test_transition_audit import AUDIT
from treadle import TaskContext, dag, task
from treadle.domain.task_records import ClaimedTask
from treadle.domain.transitions import task_edges
from treadle.engine import dead_letters
from treadle.engine.clearing import clear_tasks
from treadle.engine.diagnosis import why
from treadle.engine.execution import claim_task_instances, complete_attempt
from treadle.engine.retention import prune
from treadle.store.tables import dag_runs, task_map_items
from treadle.testing import DagRunner, run_dag


@task
def numbers(n: int) -> list[int]:
    return list(range(n))


@task(retries=0)
def square(item: int, offset: int, context: TaskContext) -> dict[str, int]:
    return {"i": context.map_index, "value": item * item + offset}


@task
def total(values: list[dict[str, int]]) -> list[int]:
    return [v["value"] for v in values]


def mapping_dag(n: int) -> Any:
    @dag(dag_id=f"mapping_{n}")
    def mapping() -> None:
        total(square.partial(offset=1).expand(item=numbers(n)))

    return mapping


def test_a_list_expands_into_instances_and_the_reducer_gets_their_results_in_order(db_url: str) -> None:
    result = run_dag(mapping_dag(12), database_url=db_url)

    assert result.state == "success"
    assert {k: v for k, v in result.task_states.items() if k.startswith("square")} == {
        f"square[{i}]": "success" for i in range(12)
    }
    assert result.results["square"] == [{"i": i, "value": i * i + 1} for i in range(12)]
    assert result.results["total"] == [i * i + 1 for i in range(12)]


def test_an_empty_list_skips_the_mapped_task_and_what_needs_it(db_url: str) -> None:
    result = run_dag(mapping_dag(0), database_url=db_url)

    assert result.task_states == {"numbers": "success", "square": "skipped", "total": "skipped"}
    assert result.state == "success"


@task
def not_a_list() -> dict[str, int]:
    return {"a": 1}


@task(retries=3)
def echo(item: Any) -> Any:
    return item


@task(trigger_rule="all_done")
def collect(values: list[Any]) -> list[Any]:
    return values


def test_a_result_that_is_not_a_list_fails_the_mapped_task_without_retries(db_url: str) -> None:
    @dag(dag_id="not_a_list")
    def bad() -> None:
        collect(echo.expand(item=not_a_list()))

    result = run_dag(bad, database_url=db_url)

    assert result.task_states == {"not_a_list": "success", "echo": "dead_letter", "collect": "success"}
    (attempt,) = result.attempts("echo")
    assert attempt.outcome == "failed" and attempt.error_type == "MapSourceNotAList"
    assert attempt.error_message == (
        "mapped task 'echo' maps over the result of 'not_a_list', which must be a list; "
        "it is of type dict: {'a': 1}"
    )
    assert result.results["collect"] == []
    assert result.state == "failed"


def test_a_list_over_the_cap_fails_then_expands_once_the_cap_is_raised_and_it_is_requeued(
    db_url: str,
) -> None:
    runner = DagRunner(mapping_dag(5), database_url=db_url, max_map_length=3)
    try:
        run_id = runner.trigger()
        failed = runner.run_until_done(run_id)
        assert failed.task_states == {
            "numbers": "success",
            "square": "dead_letter",
            "total": "upstream_failed",
        }
        (attempt,) = failed.attempts("square")
        assert attempt.error_type == "MapLengthExceeded"
        assert "would expand into 5 instances from the result of 'numbers'; the cap is 3" in (
            attempt.error_message or ""
        )
        assert "TREADLE_MAX_MAP_LENGTH=3" in (attempt.error_message or "")
        (letter,) = dead_letters.list_dead_letters(runner.db)
        assert letter.task_instance.dead_letter_reason == "non_retryable"

        runner.db.max_map_length = 10
        dead_letters.requeue_dead_letter(runner.db, letter.task_instance.id)
        fixed = runner.run_until_done(run_id)
        assert fixed.state == "success"
        assert fixed.results["total"] == [1, 2, 5, 10, 17]
        # The failed expansion's attempt stays in the history of instance 0.
        assert [
            a.attempt for a in fixed.attempts("square") if a.task_instance_id == letter.task_instance.id
        ] == [
            1,
            2,
        ]
    finally:
        runner.close()


@task(max_map_length=2)
def capped(item: int) -> int:
    return item


def test_the_task_cap_is_named_when_it_is_the_task_s(db_url: str) -> None:
    @dag(dag_id="capped")
    def capped_dag() -> None:
        capped.expand(item=numbers(3))

    result = run_dag(capped_dag, database_url=db_url)
    (attempt,) = result.attempts("capped")
    assert "the cap is 2 (max_map_length=2 on the task)" in (attempt.error_message or "")


@task(retries=0)
def fragile(item: int) -> int:
    if item % 3 == 0:
        raise ValueError(f"cannot take {item}")
    return item * 10


@task
def strict(values: list[int]) -> int:
    return sum(values)


def test_failed_instances_give_none_to_an_all_done_reducer_and_fail_a_default_one(db_url: str) -> None:
    @dag(dag_id="partly_failing")
    def partly() -> None:
        mapped = fragile.expand(item=numbers(7))
        collect(mapped)
        strict(mapped)

    result = run_dag(partly, database_url=db_url)

    assert [result.task_states[f"fragile[{i}]"] for i in range(7)] == [
        "dead_letter" if i % 3 == 0 else "success" for i in range(7)
    ]
    assert result.results["collect"] == [None, 10, 20, None, 40, 50, None]
    assert result.task_states["strict"] == "upstream_failed"
    assert result.state == "failed"


@task
def double(item: int) -> int:
    return item * 2


@task
def plus_one(item: int) -> int:
    return item + 1


def test_a_mapped_task_maps_over_another_mapped_task_s_results(db_url: str) -> None:
    @dag(dag_id="map_of_map")
    def map_of_map() -> None:
        collect(plus_one.expand(item=double.expand(item=numbers(4))))

    result = run_dag(map_of_map, database_url=db_url)
    assert result.state == "success"
    assert result.results["collect"] == [1, 3, 5, 7]


@task(max_active_mapped=3)
def paced(item: int) -> int:
    return item


def _claim(runner: DagRunner) -> list[ClaimedTask]:
    return claim_task_instances(
        runner.db, worker_id="w", hostname="h", queues=["default"], limit=100, lease_s=60
    )


def _active_paced(runner: DagRunner, run_id: str) -> int:
    return sum(
        1
        for k, v in runner.result(run_id).task_states.items()
        if k.startswith("paced[") and v in ("queued", "running")
    )


def test_max_active_mapped_bounds_the_instances_queued_or_running(db_url: str) -> None:
    @dag(dag_id="paced")
    def paced_dag() -> None:
        collect(paced.expand(item=numbers(10)))

    runner = DagRunner(paced_dag, database_url=db_url)
    try:
        run_id = runner.trigger()
        (root,) = _claim(runner)
        assert complete_attempt(runner.db, root, worker_id="w", hostname="h", value=list(range(10))).applied
        waiting = {w.map_index: w for w in why(runner.db, run_id, "paced", worker_stale_s=30)}
        assert sorted(waiting) == list(range(10))
        assert waiting[5].state == "pending"
        assert waiting[5].reason == (
            "held back by max_active_mapped=3: queued when one of the active instances of paced ends"
        )
        done: list[int] = []
        while len(done) < 10:
            claimed = _claim(runner)
            assert 1 <= len(claimed) <= 3
            assert _active_paced(runner, run_id) <= 3
            for t in claimed[:2]:  # finish some, keep the others running
                assert complete_attempt(runner.db, t, worker_id="w", hostname="h", value=t.map_item).applied
                done.append(t.map_index)
                assert _active_paced(runner, run_id) <= 3
            for t in claimed[2:]:
                assert complete_attempt(runner.db, t, worker_id="w", hostname="h", value=t.map_item).applied
                done.append(t.map_index)
        assert sorted(done) == list(range(10))
        finished = runner.run_until_done(run_id)
        assert finished.results["collect"] == list(range(10))
        assert finished.state == "success"
    finally:
        runner.close()


def make_reexpanding_dag(size_file: Path) -> Any:
    @task
    def discover() -> list[int]:
        return list(range(int(size_file.read_text())))

    @task(retries=0)
    def work(item: int) -> int:
        if (size_file.parent / f"fail-{item}").exists():
            raise ValueError(f"item {item} fails")
        return item + 100

    @dag(dag_id="reexpanding")
    def reexpanding() -> None:
        collect(work.expand(item=discover()))

    return reexpanding


def test_clear_reruns_failed_instances_or_expands_again_from_a_cleared_source(
    db_url: str, tmp_path: Path
) -> None:
    size = tmp_path / "size"
    size.write_text("4")
    (tmp_path / "fail-2").write_text("")
    runner = DagRunner(make_reexpanding_dag(size), database_url=db_url)
    try:
        run_id = runner.trigger()
        first = runner.run_until_done(run_id)
        assert first.results["collect"] == [100, 101, None, 103]
        assert first.state == "failed"

        # Only the failed instance runs again, with its own element.
        (tmp_path / "fail-2").unlink()
        report = clear_tasks(
            runner.db, run_id, ["work"], downstream=True, only_failed=True, actor="op", reason="t"
        )
        assert report.cleared == ["work", "collect"]
        states = runner.result(run_id).task_states
        assert (states["work[2]"], states["work[0]"], states["collect"]) == ("queued", "success", "pending")
        second = runner.run_until_done(run_id)
        assert second.state == "success"
        assert second.results["collect"] == [100, 101, 102, 103]

        # Clearing the source folds the mapped task back and expands it from the new list.
        size.write_text("2")
        clear_tasks(runner.db, run_id, ["discover"], downstream=True, actor="op", reason="t")
        folded = runner.result(run_id)
        assert {k: v for k, v in folded.task_states.items() if k.startswith("work")} == {"work": "pending"}
        third = runner.run_until_done(run_id)
        assert third.state == "success"
        assert third.results["collect"] == [100, 101]
        assert {k for k in third.task_states if k.startswith("work")} == {"work[0]", "work[1]"}
        detail_rows = [t for t in runner.result(run_id).attempt_history if t.task_id == "work"]
        # History is kept: the retired instances' attempts are still there.
        assert len(detail_rows) == 4 + 1 + 2

        size.write_text("5")
        clear_tasks(runner.db, run_id, ["discover"], downstream=True, actor="op", reason="t")
        fourth = runner.run_until_done(run_id)
        assert fourth.results["collect"] == [100, 101, 102, 103, 104]
    finally:
        runner.close()


@pytest.fixture
def audited_runner(pg_url: str) -> Iterator[DagRunner]:
    @task.branch
    def branch() -> str:
        return "numbers"

    @task
    def never() -> None:
        return None

    @task(retries=0)
    def last_fails(item: int) -> int:
        if item == 2:
            raise ValueError("the last one fails")
        return item

    @dag(dag_id="audited_mapping")
    def audited_mapping() -> None:
        found = numbers(3)
        branch() >> [found, never()]
        collect(last_fails.expand(item=found))

    r = DagRunner(audited_mapping, database_url=pg_url, max_map_length=2)
    with r.db.begin() as conn:
        conn.exec_driver_sql(AUDIT)
    yield r
    r.close()


@pytest.mark.postgres
def test_rules_branches_and_mapping_change_states_only_along_edges(audited_runner: DagRunner) -> None:
    r = audited_runner
    run_id = r.trigger()
    r.run_until_done(run_id)  # the expansion fails: over the cap
    (letter,) = dead_letters.list_dead_letters(r.db)
    r.db.max_map_length = 10
    dead_letters.requeue_dead_letter(r.db, letter.task_instance.id)  # expands: 3 instances
    r.run_until_done(run_id)
    clear_tasks(r.db, run_id, ["numbers"], downstream=True, actor="op", reason="audit")  # folds
    r.run_until_done(run_id)

    with r.db.read() as conn:
        seen = {
            (o, n)
            for e, o, n in conn.execute(sa.text("SELECT * FROM state_changes"))
            if e == "task_instances"
        }
    assert seen - task_edges() == set()
    assert {
        ("pending", "skipped"),  # the branch did not choose `never`
        ("pending", "dead_letter"),  # the expansion over the cap
        ("dead_letter", "pending"),  # its requeue
        ("pending", "queued"),  # expanded: instance 0 queued
        ("dead_letter", "skipped"),  # the fold retired a failed instance
        ("success", "skipped"),  # and a successful one
    } <= seen


def test_pruning_an_old_run_deletes_its_mapped_elements(db_url: str) -> None:
    runner = DagRunner(mapping_dag(3), database_url=db_url)
    try:
        run_id = runner.trigger()
        assert runner.run_until_done(run_id).state == "success"
        with runner.db.begin() as conn:
            conn.execute(
                sa.update(dag_runs)
                .where(dag_runs.c.run_id == run_id)
                .values(ended_at=datetime(2020, 1, 1, tzinfo=UTC))
            )
        dry = prune(runner.db, older_than=timedelta(days=1), dry_run=True)
        assert dry.rows.task_map_items == 3 and dry.rows.task_instances == 5
        assert prune(runner.db, older_than=timedelta(days=1)).rows.task_map_items == 3
        with runner.db.read() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(task_map_items)).scalar_one() == 0
    finally:
        runner.close()


MIXED = ["text", 'quote " and \\\\ slash', {"k": [1, 2]}, True, False, None, 1.5, [3, "x"], 7, -2, "", {}]


@task
def mixed() -> list[Any]:
    return MIXED


def test_each_instance_gets_its_element_as_the_json_it_was(db_url: str) -> None:
    @dag(dag_id="mixed")
    def mixed_dag() -> None:
        collect(echo.expand(item=mixed()))

    result = run_dag(mixed_dag, database_url=db_url)
    assert result.state == "success"
    assert result.results["collect"] == MIXED
    assert [type(v) for v in result.results["collect"]] == [type(v) for v in MIXED]
