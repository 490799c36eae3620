"""SQLite wake-ups between real processes: a trigger or a completion committed by one process
wakes the others long before their poll would have (polls here are 30 s); the socket of a
killed process is removed by the next sender; an unusable wake-up folder means polling."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.store import wakeups

pytestmark = pytest.mark.e2e

#: The workers' poll interval: only a wake-up can explain a start well before it.
POLL = "30"
#: Generous bound for "woken": far below POLL, far above any wake-up on a loaded machine.
WOKEN_WITHIN_S = 20.0

DAG = """
    from __future__ import annotations

    from treadle import dag, task


    @task
    def one() -> int:
        return 1


    @task(queue="second")
    def two(n: int) -> int:
        return n + 1


    @dag(dag_id="wake_one")
    def wake_one() -> None:
        one()


    @dag(dag_id="wake_two")
    def wake_two() -> None:
        two(one())
"""


def _first_start(c: Cluster, run_id: str) -> bool:
    return any(a.started_at is not None for a in c.detail(run_id).attempts)


def _started_soon(c: Cluster, run_id: str) -> float:
    """Seconds from now until the run's first attempt starts (fails after WOKEN_WITHIN_S)."""
    began = time.monotonic()
    wait_for(
        lambda: _first_start(c, run_id),
        timeout=WOKEN_WITHIN_S,
        interval=0.05,
        message=f"run {run_id} to start (a {POLL} s poll cannot explain a start this soon)",
    )
    return time.monotonic() - began


def _standalone_up(c: Cluster, name: str) -> None:
    c.wait_started(name)


def _socket(c: Cluster, pid: int) -> Path:
    folder = wakeups.folder_for(c.database_url)
    assert folder is not None
    return folder / str(pid)


def test_a_trigger_from_another_process_wakes_standalone(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url)
    c.write_dag("wake.py", DAG)
    proc = c.start("standalone", "standalone", "--concurrency", "2", "--poll-interval", POLL)
    _standalone_up(c, "standalone")
    wait_for(lambda: _socket(c, proc.pid).exists(), timeout=30, message="the standalone's socket")

    for _ in range(3):  # each one wakes it: none waits for the poll
        run_id = c.trigger("wake_one")
        _started_soon(c, run_id)
        assert c.wait_run(run_id).run.state == "success"


def test_a_completion_in_one_worker_wakes_another(sqlite_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(sqlite_url)
    c.write_dag("wake.py", DAG)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("first", "worker", "--concurrency", "1", "--poll-interval", POLL)
    second = c.start("second", "worker", "--queues", "second", "--poll-interval", POLL)
    for name in ("first", "second"):
        c.wait_started(name)
    wait_for(lambda: _socket(c, second.pid).exists(), timeout=30, message="the second worker's socket")

    run_id = c.trigger("wake_two")
    detail = c.wait_run(run_id, timeout=WOKEN_WITHIN_S * 2)

    assert detail.run.state == "success"
    by_task = {a.task_id: a for a in detail.attempts}
    assert by_task["one"].ended_at is not None and by_task["two"].started_at is not None
    # `two` was readied by `one`'s completion in the first worker; the second worker polls
    # every 30 s, so only the wake-up explains a start this soon after.
    assert (by_task["two"].started_at - by_task["one"].ended_at).total_seconds() < WOKEN_WITHIN_S


def test_the_socket_of_a_killed_process_is_removed_by_the_next_sender(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url)
    c.write_dag("wake.py", DAG)
    killed = c.start("killed", "standalone", "--poll-interval", POLL)
    _standalone_up(c, "killed")
    stale = _socket(c, killed.pid)
    wait_for(stale.exists, timeout=30, message="the first standalone's socket")
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert stale.exists()  # nobody removed it

    live = c.start("live", "standalone", "--poll-interval", POLL)
    _standalone_up(c, "live")
    run_id = c.trigger("wake_one")
    _started_soon(c, run_id)

    wait_for(lambda: not stale.exists(), timeout=30, message="the stale socket to be removed")
    assert _socket(c, live.pid).exists()


def test_an_unusable_wakeup_folder_falls_back_to_polling(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url)
    c.write_dag("wake.py", DAG)
    folder = wakeups.folder_for(sqlite_url)
    assert folder is not None
    folder.write_text("a file where the folder should be")
    c.start("standalone", "standalone", "--poll-interval", "0.5")
    _standalone_up(c, "standalone")

    run_id = c.trigger("wake_one")

    assert c.wait_run(run_id).run.state == "success"
    log = c.log("standalone")
    assert log.count('"store.wakeups_off"') == 1
    assert "Traceback" not in log
    assert folder.read_text() == "a file where the folder should be"
