"""`max_active_mapped` holds in every path that puts a mapped instance back to run: a dead-letter
requeue, a clear, a needs_inspection resolved as requeue, retries; and under concurrency (two
requeues at once, requeues racing a sibling's end that releases a held-back instance)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from treadle import dag, task
from treadle.domain.states import AttemptOutcome
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.engine import dead_letters
from treadle.engine.clearing import clear_tasks
from treadle.engine.execution import claim_task_instances, complete_attempt, fail_attempt
from treadle.engine.inspection import Resolution, resolve
from treadle.store.database import Database
from treadle.store.tables import task_instances as ti
from treadle.testing import DagRunner

LIMIT = 2
#: States that take one of the task's max_active_mapped places.
HOLDING = ("queued", "running", "retry_wait", "up_for_reschedule", "needs_inspection")


@task
def items(n: int) -> list[int]:
    return list(range(n))


@task(max_active_mapped=LIMIT, retries=0)
def part(item: int) -> int:
    return item


@task
def gather(values: list[int]) -> list[int]:
    return values


def make_dag(n: int) -> Callable[[], None]:
    @dag(dag_id="bounded")
    def bounded() -> None:
        gather(part.expand(item=items(n)))

    return bounded


@pytest.fixture
def runner(db_url: str) -> Iterator[DagRunner]:
    r = DagRunner(make_dag(6), database_url=db_url)
    yield r
    r.close()


def _claim(db: Database, limit: int = 100) -> list[ClaimedTask]:
    return claim_task_instances(db, worker_id="w", hostname="h", queues=["default"], limit=limit, lease_s=60)


def _states(db: Database, run_id: str) -> dict[int, str]:
    stmt = sa.select(ti.c.map_index, ti.c.state).where(
        ti.c.run_id == run_id, ti.c.task_id == "part", ti.c.map_index >= 0
    )
    with db.engine.connect() as conn:
        return {r.map_index: r.state for r in conn.execute(stmt)}


def _active(db: Database, run_id: str) -> int:
    return sum(1 for s in _states(db, run_id).values() if s in HOLDING)


def _assert_bound_and_no_idle_room(db: Database, run_id: str) -> None:
    states = _states(db, run_id)
    active = sum(1 for s in states.values() if s in HOLDING)
    held = [i for i, s in states.items() if s == "pending"]
    assert active <= LIMIT, states
    # Never an instance held back while there is room for it.
    assert not held or active == LIMIT, states


def _fail(db: Database, t: ClaimedTask, *, unknown_commit: bool = False) -> None:
    error = AttemptError(
        error_type="ValueError", message="boom", retryable=False, unknown_commit=unknown_commit
    )
    outcome = AttemptOutcome.UNKNOWN_COMMIT if unknown_commit else AttemptOutcome.FAILED
    fail_attempt(db, t, outcome=outcome, error=error, worker_id="w", hostname="h")


def _complete(db: Database, t: ClaimedTask) -> None:
    """Succeed as the task would: an instance returns its element, `gather` the list it got."""
    value = t.upstream_results.get("part") if t.task_id == "gather" else t.map_item
    assert complete_attempt(db, t, worker_id="w", hostname="h", value=value).applied


def _expanded(runner: DagRunner) -> tuple[str, list[ClaimedTask]]:
    """A run whose list task succeeded: instances 0 and 1 of `part` claimed, 2..5 held back."""
    run_id = runner.trigger()
    (root,) = _claim(runner.db)
    assert complete_attempt(runner.db, root, worker_id="w", hostname="h", value=list(range(6))).applied
    first = _claim(runner.db)
    assert sorted(t.map_index for t in first) == [0, 1]
    return run_id, first


def _dead_letter_id(db: Database, run_id: str, map_index: int) -> int:
    with db.engine.connect() as conn:
        found = conn.execute(
            sa.select(ti.c.id).where(
                ti.c.run_id == run_id, ti.c.task_id == "part", ti.c.map_index == map_index
            )
        ).scalar_one()
    return int(found)


def _finish(runner: DagRunner, run_id: str) -> None:
    """Run the rest, checking the bound after each claim; the run succeeds with every result."""
    while True:
        claimed = _claim(runner.db)
        _assert_bound_and_no_idle_room(runner.db, run_id)
        if not claimed:
            break
        for t in claimed:
            _complete(runner.db, t)
            _assert_bound_and_no_idle_room(runner.db, run_id)
    finished = runner.run_until_done(run_id)
    assert finished.state == "success"
    assert finished.results["gather"] == list(range(6))


def test_a_requeued_dead_letter_waits_while_its_siblings_fill_the_bound(runner: DagRunner) -> None:
    run_id, (a, b) = _expanded(runner)
    _fail(runner.db, a)  # dead letter: its end lets instance 2 go
    assert _states(runner.db, run_id)[2] == "queued"
    assert _active(runner.db, run_id) == LIMIT
    dead_letters.requeue_dead_letter(runner.db, _dead_letter_id(runner.db, run_id, 0))
    # Before the fix it went straight to queued: three active under a bound of two.
    assert _states(runner.db, run_id)[0] == "pending"
    _assert_bound_and_no_idle_room(runner.db, run_id)
    _complete(runner.db, b)  # one ends: the lowest held-back instance, the requeued 0, goes
    assert _states(runner.db, run_id)[0] == "queued"
    _assert_bound_and_no_idle_room(runner.db, run_id)
    _finish(runner, run_id)


def test_a_requeue_with_room_free_queues_at_once(runner: DagRunner) -> None:
    run_id, (a, b) = _expanded(runner)
    _fail(runner.db, a)
    _fail(runner.db, b)
    (two, three) = _claim(runner.db)
    _complete(runner.db, two)
    _complete(runner.db, three)
    for t in _claim(runner.db):
        _complete(runner.db, t)
    assert _active(runner.db, run_id) == 0
    dead_letters.requeue_dead_letter(runner.db, _dead_letter_id(runner.db, run_id, 1))
    assert _states(runner.db, run_id)[1] == "queued"
    _finish_after_one_more(runner, run_id)


def _finish_after_one_more(runner: DagRunner, run_id: str) -> None:
    dead_letters.requeue_dead_letter(runner.db, _dead_letter_id(runner.db, run_id, 0))
    _assert_bound_and_no_idle_room(runner.db, run_id)
    _finish(runner, run_id)


def test_a_clear_of_many_instances_queues_only_up_to_the_bound(runner: DagRunner) -> None:
    run_id, first = _expanded(runner)
    claimed = first
    while claimed:  # every instance fails: each end lets the next held-back one go
        for t in claimed:
            _fail(runner.db, t)
        claimed = _claim(runner.db)
    assert set(_states(runner.db, run_id).values()) == {"dead_letter"}
    clear_tasks(runner.db, run_id, ["part"], downstream=True, only_failed=True, actor="op", reason="t")
    # Before the fix all six went back to queued under a bound of two.
    states = _states(runner.db, run_id)
    assert [states[i] for i in range(6)] == ["queued", "queued", "pending", "pending", "pending", "pending"]
    _finish(runner, run_id)


def test_an_inspection_resolved_as_requeue_waits_while_its_siblings_fill_the_bound(
    runner: DagRunner,
) -> None:
    run_id, (a, b) = _expanded(runner)
    _fail(runner.db, a, unknown_commit=True)
    # needs_inspection holds its place: nothing is let go by it.
    assert _states(runner.db, run_id)[0] == "needs_inspection"
    assert _states(runner.db, run_id)[2] == "pending"
    _complete(runner.db, b)  # lets instance 2 go
    assert _active(runner.db, run_id) == LIMIT
    resolve(
        runner.db, run_id, "part", resolution=Resolution.REQUEUE, reason="checked", actor="op", map_index=0
    )
    # It gave its place up and took it back at once: still two active, 0 queued again.
    assert _states(runner.db, run_id)[0] == "queued"
    _assert_bound_and_no_idle_room(runner.db, run_id)
    _finish(runner, run_id)


def test_an_inspection_resolved_as_requeue_is_held_back_when_the_bound_is_full(
    runner: DagRunner,
) -> None:
    run_id, (a, b) = _expanded(runner)
    _fail(runner.db, a, unknown_commit=True)
    resolve(runner.db, run_id, "part", resolution=Resolution.FAILED, reason="bad", actor="op", map_index=0)
    # Resolved failed: a dead letter, whose end let instance 2 go.
    assert _states(runner.db, run_id)[2] == "queued"
    dead_letters.requeue_dead_letter(runner.db, _dead_letter_id(runner.db, run_id, 0))
    assert _states(runner.db, run_id)[0] == "pending"
    _assert_bound_and_no_idle_room(runner.db, run_id)
    _complete(runner.db, b)
    _finish(runner, run_id)


@pytest.mark.postgres
def test_concurrent_requeues_and_a_releasing_end_keep_the_bound(pg_url: str) -> None:
    """Two dead letters requeued at once while a sibling's end releases a held-back instance,
    each in its own thread and connection on PostgreSQL, many rounds: the bound holds in every
    committed state a watcher sees, and no instance is left held back with room free."""
    for round_ in range(12):
        _race(pg_url, ending=round_ % 2)


def _race(url: str, *, ending: int) -> None:
    runner = DagRunner(make_dag(6), database_url=url)
    try:
        run_id, (a, b) = _expanded(runner)
        _fail(runner.db, a)
        _fail(runner.db, b)  # 2 and 3 go
        running = _claim(runner.db)
        assert sorted(t.map_index for t in running) == [2, 3]
        ids = [_dead_letter_id(runner.db, run_id, i) for i in (0, 1)]
        seen: list[int] = []
        stop = threading.Event()
        errors: list[BaseException] = []
        gate = threading.Barrier(3)

        def watch() -> None:
            while not stop.is_set():
                seen.append(_active(runner.db, run_id))

        def go(fn: Callable[[], object]) -> threading.Thread:
            def body() -> None:
                try:
                    gate.wait(timeout=30)
                    fn()
                except BaseException as exc:
                    errors.append(exc)

            return threading.Thread(target=body)

        workers = [
            go(lambda: dead_letters.requeue_dead_letter(runner.db, ids[0])),
            go(lambda: dead_letters.requeue_dead_letter(runner.db, ids[1])),
            go(lambda: _complete(runner.db, running[ending])),
        ]
        watcher = threading.Thread(target=watch)
        watcher.start()
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=120)
        stop.set()
        watcher.join(timeout=30)
        assert not errors, errors
        assert seen and max(seen) <= LIMIT, seen
        _assert_bound_and_no_idle_room(runner.db, run_id)
        _complete(runner.db, running[1 - ending])
        _finish(runner, run_id)
    finally:
        runner.close()
