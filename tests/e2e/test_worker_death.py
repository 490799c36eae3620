"""A worker killed with SIGKILL mid-task leaves nothing stuck: its lease expires, the attempt is
recorded `lost`, and the task is retried and succeeds on the surviving worker."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import SHORT_LEASE, Cluster, process_alive
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.e2e

KILL_ME_DAG = """
    from __future__ import annotations

    import os
    import subprocess
    import time

    from treadle import TaskContext, dag, task

    EVENTS = __EVENTS__
    PIDS = __PIDS__


    def note(line: str) -> None:
        fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\\n").encode())
        finally:
            os.close(fd)


    @task(retries=2, retry_delay=0)
    def slow(context: TaskContext) -> dict:
        with open(os.path.join(PIDS, f"slow-{context.attempt}"), "w") as f:
            f.write(str(os.getpid()))
        note(f"start {context.attempt} {os.getpid()}")
        if context.attempt == 1:
            helper = subprocess.Popen(["sleep", "60"])
            with open(os.path.join(PIDS, "slow-1-sleep"), "w") as f:
                f.write(str(helper.pid))
            time.sleep(60)
        note(f"end {context.attempt} {os.getpid()}")
        return {"attempt": context.attempt}


    @task
    def after(value: dict) -> int:
        return value["attempt"]


    @dag(dag_id="kill_me")
    def kill_me() -> None:
        after(slow())
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_sigkilled_worker_attempt_is_lost_then_retried_elsewhere(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url, **SHORT_LEASE)
    events = c.root / "events.log"
    c.write_dag("kill_me.py", KILL_ME_DAG, events=str(events), pids=str(c.pids))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    workers = {"w1": c.worker("w1"), "w2": c.worker("w2")}

    run_id = c.trigger("kill_me")
    wait_for(lambda: (c.pids / "slow-1-sleep").exists(), timeout=30, message="attempt 1 to start")
    slow_ti = next(t for t in c.detail(run_id).task_instances if t.task_id == "slow")
    assert slow_ti.state == "running" and slow_ti.attempt == 1 and slow_ti.worker_id
    victim = next(n for n, p in workers.items() if f"-{p.pid}-" in slow_ti.worker_id)
    survivor = next(n for n in workers if n != victim)
    task_pids = [int((c.pids / name).read_text()) for name in ("slow-1", "slow-1-sleep")]
    assert all(process_alive(pid) for pid in task_pids)

    c.signal(victim, signal.SIGKILL)
    workers[victim].wait(timeout=10)
    # The attempt's child process and what it started do not outlive their worker (else
    # attempt 1 would still be running next to attempt 2).
    wait_for(
        lambda: not any(process_alive(pid) for pid in task_pids),
        timeout=5,
        message="the killed worker's task processes to exit",
    )

    detail = c.wait_run(run_id, timeout=45)

    assert detail.run.state == "success"
    states = {t.task_id: t for t in detail.task_instances}
    assert states["slow"].state == "success" and states["slow"].attempt == 2
    assert states["slow"].orphaned_count == 1
    assert states["after"].state == "success"
    slow_attempts = [a for a in detail.attempts if a.task_id == "slow"]
    assert [(a.attempt, a.outcome) for a in slow_attempts] == [(1, "lost"), (2, "success")]
    lost, won = slow_attempts
    assert lost.error_type == "LeaseExpired"
    assert lost.worker_id == slow_ti.worker_id
    assert lost.late_result is None
    assert won.worker_id is not None and f"-{workers[survivor].pid}-" in won.worker_id
    assert detail.results == {"slow": {"attempt": 2}, "after": 2}
    # Attempt 1 never finished: its only trace is the start line.
    assert [line.split()[:2] for line in _lines(events)] == [["start", "1"], ["start", "2"], ["end", "2"]]
    assert workers[survivor].poll() is None


POISON_DAG = """
    from __future__ import annotations

    import os
    import signal

    from treadle import dag, task


    def worker_pid() -> int:
        # The `treadle worker` above this task process (its parent is the fork server).
        pid = os.getppid()
        while "worker" not in open(f"/proc/{pid}/cmdline").read().split("\\0"):
            pid = int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])
        return pid


    @task(retries=10, retry_delay=0)
    def poison() -> None:
        os.kill(worker_pid(), signal.SIGKILL)  # takes its worker down, every time


    @task
    def healthy() -> str:
        return "ok"


    @dag(dag_id="poisoned")
    def poisoned() -> None:
        poison()
        healthy()
"""


@pytest.mark.postgres
def test_task_that_kills_its_worker_is_dead_lettered_as_poison_after_three_losses(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url, **SHORT_LEASE)
    c.write_dag("poisoned.py", POISON_DAG)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("worker")
    run_id = c.trigger("poisoned")
    restarts = 0

    def supervise() -> bool:
        """Restart the worker whenever the poison task has killed it (like a process supervisor)."""
        nonlocal restarts
        ti = next(t for t in c.detail(run_id).task_instances if t.task_id == "poison")
        if ti.state == "dead_letter":
            return True
        if c.procs["worker"].poll() is not None:
            c.worker("worker")
            restarts += 1
        return False

    wait_for(supervise, timeout=60, interval=0.2, message="the poison task to be dead-lettered")
    detail = c.wait_run(run_id, timeout=30)

    assert detail.run.state == "failed"
    poison = next(t for t in detail.task_instances if t.task_id == "poison")
    assert (poison.state, poison.dead_letter_reason, poison.orphaned_count) == ("dead_letter", "poison", 3)
    attempts = [a for a in detail.attempts if a.task_id == "poison"]
    # Three lease expiries end it, although its retry budget (10) is far from spent.
    assert [(a.attempt, a.outcome, a.error_type) for a in attempts] == [
        (n, "lost", "LeaseExpired") for n in (1, 2, 3)
    ]
    assert attempts[-1].retry_delay_s is None
    assert restarts == 3  # one per attempt; no fourth attempt was started
    assert c.procs["worker"].poll() is None
    healthy = next(t for t in detail.task_instances if t.task_id == "healthy")
    assert healthy.state == "success"
    dead = c.cli_json("dead-letters", "list")
    assert [(d["task_instance"]["task_id"], d["task_instance"]["dead_letter_reason"]) for d in dead] == [
        ("poison", "poison")
    ]
