"""User code that kills or hangs its process ends one attempt, never the worker."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster, process_alive
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.e2e

CRASHERS_DAG = """
    from __future__ import annotations

    import os
    import resource
    import signal
    import time

    from treadle import dag, task


    @task
    def exits() -> None:
        os._exit(3)


    @task
    def segfaults() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from this test
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(30)


    @task
    def raises() -> None:
        raise SystemExit(4)


    @task
    def fine() -> str:
        time.sleep(0.5)  # still running while its siblings crash
        return "fine"


    @task
    def after_fine(value: str) -> str:
        return value + "!"


    @task
    def after_exits() -> None: ...


    @dag(dag_id="crashers")
    def crashers() -> None:
        exits() >> after_exits()
        segfaults()
        raises()
        after_fine(fine())


    @dag(dag_id="calm")
    def calm() -> None:
        fine()
"""


def test_child_exit_and_segfault_fail_only_their_attempt(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url)
    c.write_dag("crashers.py", CRASHERS_DAG)
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    worker = c.worker("worker", concurrency=3)

    run_id = c.trigger("crashers")
    detail = c.wait_run(run_id, timeout=60)

    assert detail.run.state == "failed"
    states = {t.task_id: (t.state, t.dead_letter_reason) for t in detail.task_instances}
    assert states == {
        "exits": ("dead_letter", "retries_exhausted"),
        "after_exits": ("upstream_failed", None),
        "segfaults": ("dead_letter", "retries_exhausted"),
        "raises": ("dead_letter", "retries_exhausted"),
        "fine": ("success", None),
        "after_fine": ("success", None),
    }
    attempts = {a.task_id: a for a in detail.attempts}
    assert sorted(attempts) == ["after_fine", "exits", "fine", "raises", "segfaults"]
    assert (attempts["exits"].outcome, attempts["exits"].error_type) == ("failed", "ChildProcessDied")
    assert attempts["exits"].error_message == "child process exited with code 3"
    assert (attempts["segfaults"].outcome, attempts["segfaults"].error_type) == ("failed", "ChildProcessDied")
    assert attempts["segfaults"].error_message == "child process was killed by signal SIGSEGV"
    # SystemExit is caught inside the child: an ordinary failure that names it.
    assert (attempts["raises"].outcome, attempts["raises"].error_type) == ("failed", "SystemExit")
    assert detail.results == {"fine": "fine", "after_fine": "fine!"}

    # The worker survived and its replacement children serve the next run.
    assert worker.poll() is None
    calm = c.wait_run(c.trigger("calm"), timeout=30)
    assert calm.run.state == "success" and calm.results == {"fine": "fine"}
    assert worker.poll() is None


HANGS_DAG = """
    from __future__ import annotations

    import os
    import subprocess
    import time

    from treadle import dag, task

    PIDS = __PIDS__


    @task(timeout=1)
    def hangs() -> None:
        helper = subprocess.Popen(["sleep", "60"])
        with open(os.path.join(PIDS, "hangs"), "w") as f:
            f.write(f"{os.getpid()} {helper.pid}")
        time.sleep(60)


    @task
    def quick() -> int:
        return 7


    @dag(dag_id="hangs")
    def hangs_dag() -> None:
        hangs()
        quick()
"""


def test_timeout_kills_the_attempt_and_the_processes_it_started(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url)
    c.write_dag("hangs.py", HANGS_DAG, pids=str(c.pids))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    worker = c.worker("worker", concurrency=2)

    run_id = c.trigger("hangs")
    wait_for(lambda: (c.pids / "hangs").exists(), timeout=30, message="the task to start its helper")
    task_pids = c.recorded_pids()
    assert len(task_pids) == 2 and all(process_alive(pid) for pid in task_pids)
    detail = c.wait_run(run_id, timeout=30)

    assert detail.run.state == "failed"
    (attempt,) = [a for a in detail.attempts if a.task_id == "hangs"]
    assert (attempt.outcome, attempt.error_type) == ("timed_out", "TaskTimeout")
    assert re.match(r"exceeded its timeout of 1(\.0)? s", attempt.error_message or "")
    assert attempt.duration_s is not None and 1.0 <= attempt.duration_s < 10
    states = {t.task_id: (t.state, t.dead_letter_reason) for t in detail.task_instances}
    assert states == {"hangs": ("dead_letter", "retries_exhausted"), "quick": ("success", None)}
    # Both the task's process and the `sleep 60` it started are gone.
    wait_for(
        lambda: not any(process_alive(pid) for pid in task_pids),
        timeout=5,
        message="the timed-out task's processes to exit",
    )
    assert worker.poll() is None


LEAVES_DAG = """
    from __future__ import annotations

    import os
    import subprocess

    from treadle import dag, task

    PIDS = __PIDS__


    @task
    def leaves_helpers() -> str:
        helper = subprocess.Popen(["sleep", "300"])
        # A grandchild of the task, started through a shell that waits for it.
        nested_file = os.path.join(PIDS, "nested.tmp")
        subprocess.Popen(["sh", "-c", f"sleep 301 & echo $! > {nested_file}; wait"])
        while not os.path.exists(nested_file) or not open(nested_file).read().strip():
            pass
        with open(os.path.join(PIDS, "helpers"), "w") as f:
            f.write(f"{helper.pid} {open(nested_file).read().strip()}")
        os.unlink(nested_file)
        return "returned"


    @dag(dag_id="leaves")
    def leaves() -> None:
        leaves_helpers()
"""


def test_processes_a_task_leaves_running_are_killed_when_its_attempt_ends(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url)
    c.write_dag("leaves.py", LEAVES_DAG, pids=str(c.pids))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    worker = c.worker("worker")

    detail = c.wait_run(c.trigger("leaves"), timeout=60)
    assert detail.run.state == "success" and detail.results == {"leaves_helpers": "returned"}
    helpers = c.recorded_pids()
    assert len(helpers) == 2
    wait_for(
        lambda: not any(process_alive(pid) for pid in helpers),
        timeout=30,
        message="the processes the task left running to be killed",
    )
    # The child that ran the task survived its own clean-up and serves the next attempt.
    assert c.wait_run(c.trigger("leaves"), timeout=60).run.state == "success"
    assert worker.poll() is None
    (first, *_) = [ln for ln in c.log("worker").splitlines() if "killed processes a task left" in ln]
    assert set(map(str, helpers)) <= set(first.rpartition(": ")[2].split())
