"""The run open/close protocol under races (docs/architecture.md, "The run open/close protocol").

Each race pauses a closer right after its first look for active task instances (a real store
call, wrapped) and commits a reopener in that gap, from another connection: the run must end
running with the reopened task, never terminal with an active instance. SQLite has one writer
at a time, so these interleavings cannot happen there; they run on PostgreSQL and MariaDB.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.helpers.pauses import Pause, in_thread
from treadle import dag, task
from treadle.domain.states import AttemptOutcome, TaskState
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.engine import queries
from treadle.engine.cancellation import cancel_run
from treadle.engine.clearing import clear_tasks
from treadle.engine.dead_letters import requeue_dead_letter, requeue_fingerprint
from treadle.engine.execution import claim_task_instances, complete_attempt, fail_attempt
from treadle.engine.runs import finish_idle_runs
from treadle.errors import RunCancelledError
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.tables import dag_runs
from treadle.testing import DagRunner


@task(retries=0)
def a() -> int:
    return 1


@task
def b() -> int:
    return 2


@task
def c(x: int) -> int:
    return x


@dag(dag_id="protocol")
def protocol() -> None:
    c(a())
    b()


@task
def join(x: int, y: int) -> int:
    return x + y


@dag(dag_id="fan_in")
def fan_in() -> None:
    join(a(), b())


RACE_DIALECTS = [
    pytest.param("pg_url", marks=pytest.mark.postgres),
    pytest.param("mysql_url", marks=pytest.mark.mysql),
]


@pytest.fixture(params=RACE_DIALECTS)
def race_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param)
    return url


@pytest.fixture
def runner(race_url: str) -> Iterator[DagRunner]:
    r = DagRunner(protocol, database_url=race_url)
    yield r
    r.close()


def _claim(runner: DagRunner, worker: str = "w") -> dict[str, ClaimedTask]:
    claimed = claim_task_instances(
        runner.db, worker_id=worker, hostname="h", queues=["default"], limit=10, lease_s=60
    )
    return {t.task_id: t for t in claimed}


def _fail_for_good(runner: DagRunner, attempt: ClaimedTask) -> None:
    error = AttemptError(error_type="Boom", message="boom", retryable=False)
    ending = fail_attempt(
        runner.db, attempt, outcome=AttemptOutcome.FAILED, error=error, worker_id="w", hostname="h"
    )
    assert ending.applied


def _states(runner: DagRunner, run_id: str) -> tuple[str, dict[str, str]]:
    detail = queries.run_detail(runner.db, run_id)
    return detail.run.state, {t.task_id: t.state for t in detail.task_instances}


def _instance_id(runner: DagRunner, run_id: str, task_id: str) -> int:
    return next(t.id for t in queries.run_detail(runner.db, run_id).task_instances if t.task_id == task_id)


def _idle_running_run(runner: DagRunner) -> str:
    """A run whose instances all ended (a dead, c upstream_failed, b success) but that is still
    running, as when concurrent completions each saw the other active and left it to the sweep."""
    run_id = runner.trigger()
    held = _claim(runner)
    _fail_for_good(runner, held["a"])
    assert complete_attempt(runner.db, held["b"], worker_id="w", hostname="h", value=2).applied
    with runner.db.begin() as conn:
        conn.execute(
            sa.update(dag_runs).where(dag_runs.c.run_id == run_id).values(state="running", ended_at=None)
        )
    assert _states(runner, run_id) == (
        "running",
        {"a": "dead_letter", "b": "success", "c": "upstream_failed"},
    )
    return run_id


def _finish_reopened(runner: DagRunner, run_id: str) -> None:
    """Run the reopened tasks to the end: the run must close success."""
    for task_id in ("a", "c"):
        attempt = _claim(runner)[task_id]
        assert complete_attempt(runner.db, attempt, worker_id="w", hostname="h", value=1).applied
    assert _states(runner, run_id)[0] == "success"


def _race(pause: Pause, closer: object, reopener: object) -> None:
    """Pause the closer after its first probe, run the reopener to its end, then let the closer go.

    Should the reopener wait on a lock the paused closer holds, it is given 20 s, then the closer
    is released and both finish: the outcome is checked either way.
    """
    pause.run(closer)  # type: ignore[arg-type]
    thread, box = in_thread(reopener)  # type: ignore[arg-type]
    thread.join(20)
    pause.release()
    thread.join(60)
    assert not thread.is_alive()
    if "error" in box:
        raise box["error"]


def test_sweep_between_its_probe_and_its_close_never_closes_over_a_requeue(
    runner: DagRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _idle_running_run(runner)
    a_id = _instance_id(runner, run_id, "a")
    pause = Pause(monkeypatch, run_store, "has_active_tasks")

    _race(pause, lambda: finish_idle_runs(runner.db), lambda: requeue_dead_letter(runner.db, a_id))

    assert _states(runner, run_id) == ("running", {"a": "queued", "b": "success", "c": "pending"})
    _finish_reopened(runner, run_id)


def test_sweep_between_its_probe_and_its_close_never_closes_over_a_clear(
    runner: DagRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _idle_running_run(runner)
    pause = Pause(monkeypatch, run_store, "has_active_tasks")

    _race(
        pause,
        lambda: finish_idle_runs(runner.db),
        lambda: clear_tasks(runner.db, run_id, ["a"], downstream=True, actor="op", reason="fixed"),
    )

    assert _states(runner, run_id) == ("running", {"a": "queued", "b": "success", "c": "pending"})
    _finish_reopened(runner, run_id)


def test_a_completion_closing_its_run_never_closes_over_a_requeue(
    runner: DagRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = runner.trigger()
    held = _claim(runner)
    _fail_for_good(runner, held["a"])  # a dead, c upstream_failed; b (a leaf) still running
    a_id = _instance_id(runner, run_id, "a")
    pause = Pause(monkeypatch, run_store, "has_active_tasks")

    _race(
        pause,
        lambda: complete_attempt(runner.db, held["b"], worker_id="w", hostname="h", value=2),
        lambda: requeue_dead_letter(runner.db, a_id),
    )

    assert _states(runner, run_id) == ("running", {"a": "queued", "b": "success", "c": "pending"})
    _finish_reopened(runner, run_id)


def test_cancelling_a_run_cancels_what_a_concurrent_requeue_reopened(
    runner: DagRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from treadle.store import cancellation as cancel_store

    run_id = runner.trigger()
    held = _claim(runner)
    _fail_for_good(runner, held["a"])  # b still running keeps the run open
    a_id = _instance_id(runner, run_id, "a")
    pause = Pause(monkeypatch, cancel_store, "active_instances")

    _race(
        pause, lambda: cancel_run(runner.db, run_id, actor="op"), lambda: requeue_dead_letter(runner.db, a_id)
    )

    state, tasks = _states(runner, run_id)
    assert state == "cancelled"
    assert not {
        t for t, s in tasks.items() if s not in ("success", "dead_letter", "upstream_failed", "cancelled")
    }
    assert (
        claim_task_instances(
            runner.db, worker_id="w2", hostname="h", queues=["default"], limit=10, lease_s=60
        )
        == []
    )


def test_a_requeue_in_a_cancelled_run_is_refused_and_a_clear_reopens_it(runner: DagRunner) -> None:
    run_id = runner.trigger()
    held = _claim(runner)
    _fail_for_good(runner, held["a"])
    cancel_run(runner.db, run_id, actor="op", reason="wrong day")
    a_id = _instance_id(runner, run_id, "a")

    with pytest.raises(RunCancelledError, match=r"was cancelled.*treadle tasks clear"):
        requeue_dead_letter(runner.db, a_id)
    assert _states(runner, run_id) == (
        "cancelled",
        {"a": "dead_letter", "b": "cancelled", "c": "upstream_failed"},
    )
    assert (
        claim_task_instances(runner.db, worker_id="w", hostname="h", queues=["default"], limit=10, lease_s=60)
        == []
    )

    group = requeue_fingerprint(runner.db, queries_fingerprint(runner, a_id))
    assert (group.requeued, [i for i, _ in group.refused]) == ([], [a_id])

    clear_tasks(runner.db, run_id, None, downstream=False, actor="op", reason="rerun after all")
    assert _states(runner, run_id) == ("running", {"a": "queued", "b": "queued", "c": "pending"})


def queries_fingerprint(runner: DagRunner, task_instance_id: int) -> str:
    from treadle.engine.dead_letters import list_dead_letters

    return next(d.fingerprint for d in list_dead_letters(runner.db) if d.task_instance.id == task_instance_id)


def test_requeue_applies_nothing_when_the_instance_moved_under_it(runner: DagRunner) -> None:
    run_id = runner.trigger()
    held = _claim(runner)
    _fail_for_good(runner, held["a"])
    a_id = _instance_id(runner, run_id, "a")
    # Another operator requeued it first: the second requeue names the state it found.
    requeue_dead_letter(runner.db, a_id)
    with pytest.raises(Exception, match="is queued, not dead_letter"):
        requeue_dead_letter(runner.db, a_id)
    with runner.db.read() as conn:
        assert ti_store.get_task_instance(conn, a_id).state == TaskState.QUEUED.value  # type: ignore[union-attr]


def test_a_fan_in_whose_branch_failed_closes_with_the_last_success_not_the_sweep(db_url: str) -> None:
    runner = DagRunner(fan_in, database_url=db_url)
    try:
        run_id = runner.trigger()
        held = _claim(runner)
        _fail_for_good(runner, held["a"])  # join -> upstream_failed; b still running
        assert _states(runner, run_id)[0] == "running"

        assert complete_attempt(runner.db, held["b"], worker_id="w", hostname="h", value=2).applied

        # Closed in the completion's own transaction: no sweep ran.
        assert _states(runner, run_id) == (
            "failed",
            {"a": "dead_letter", "b": "success", "join": "upstream_failed"},
        )
    finally:
        runner.close()
