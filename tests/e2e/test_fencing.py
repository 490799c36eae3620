"""A worker frozen past its lease (SIGSTOP, like a long GC or VM pause) cannot apply anything for
the attempt it lost once it resumes: completion is fenced by worker id and attempt number."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import SHORT_LEASE, Cluster, process_alive
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

PAUSED_DAG = """
    from __future__ import annotations

    import os
    import time

    from treadle import TaskContext, dag, task

    EVENTS = __EVENTS__
    PIDS = __PIDS__
    FIRST_ATTEMPT_S = __FIRST_ATTEMPT_S__


    def note(line: str) -> None:
        fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\\n").encode())
        finally:
            os.close(fd)


    @task(retries=2, retry_delay=0)
    def fenced(context: TaskContext) -> dict:
        with open(os.path.join(PIDS, f"fenced-{context.attempt}"), "w") as f:
            f.write(str(os.getpid()))
        note(f"start {context.attempt}")
        # Attempt 2 runs long enough for the resumed worker to report while it is in flight.
        time.sleep(FIRST_ATTEMPT_S if context.attempt == 1 else 4)
        note(f"end {context.attempt}")
        return {"attempt": context.attempt}


    @task
    def downstream(value: dict) -> dict:
        note(f"downstream {value['attempt']}")
        return value


    @dag(dag_id="paused")
    def paused() -> None:
        downstream(fenced())
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _local_ports(pid: int) -> set[int]:
    """Local TCP ports of `pid`'s sockets, from /proc: its database sessions' client ports."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _pause_outside_transactions(c: Cluster, name: str) -> None:
    """SIGSTOP `name` at a moment it holds no open transaction (frozen inside one, its row locks
    would stall the reaper until it resumes: a different scenario); retry otherwise. Only its
    own sessions count: on a busy machine some other process's transaction is nearly always
    open, and resuming the worker again and again would let the attempt finish unpaused."""
    open_transactions = (
        "SELECT client_port, xact_start FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
    )
    for _ in range(20):
        c.signal(name, signal.SIGSTOP)
        ports = _local_ports(c.procs[name].pid)
        seen = []
        with c.db.engine.connect() as conn:
            for _ in range(3):
                rows = conn.exec_driver_sql(open_transactions)
                seen.append({tuple(r) for r in rows if r.client_port in ports})
                time.sleep(0.05)
        if not set.intersection(*seen):
            return
        c.signal(name, signal.SIGCONT)
        time.sleep(0.1)
    raise AssertionError(f"could not pause {name} outside a transaction")


@pytest.mark.parametrize("finishes_while_paused", [True, False], ids=["late-report", "self-fenced"])
def test_worker_paused_past_its_lease_cannot_apply_its_attempt(
    pg_url: str, cluster: Callable[..., Cluster], finishes_while_paused: bool
) -> None:
    """Guarantees proven here, for a worker SIGSTOPped mid-attempt longer than its lease:

    * the scheduler records the attempt `lost` (LeaseExpired) and the retry runs on the other
      worker; the task instance's final state, result and downstream come from that attempt;
    * late-report: the paused worker's child finished the task during the pause (the child is
      not frozen with its worker, so its side effect did happen once more: execution is
      at-least-once). On resume its success report is fenced: nothing is applied while the new
      attempt is still running, and the lost attempt's `late_result` records the discarded report;
    * self-fenced: the task was still running at resume; the worker's next heartbeat finds the
      lease gone, kills the attempt's child, and reports nothing (`late_result` stays empty).

    In both cases exactly one success is recorded for the task instance.
    """
    c = cluster(pg_url, **SHORT_LEASE)
    events = c.root / "events.log"
    first_attempt_s = 1.0 if finishes_while_paused else 60.0
    c.write_dag(
        "paused.py", PAUSED_DAG, events=str(events), pids=str(c.pids), first_attempt_s=first_attempt_s
    )
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    workers = {"w1": c.worker("w1"), "w2": c.worker("w2")}

    run_id = c.trigger("paused")
    wait_for(lambda: "start 1" in _lines(events), timeout=30, message="attempt 1 to start")
    ti = next(t for t in c.detail(run_id).task_instances if t.task_id == "fenced")
    assert ti.state == "running" and ti.attempt == 1 and ti.worker_id
    frozen = next(n for n, p in workers.items() if f"-{p.pid}-" in ti.worker_id)
    other = next(n for n in workers if n != frozen)
    first_child = int((c.pids / "fenced-1").read_text())

    _pause_outside_transactions(c, frozen)
    if finishes_while_paused:
        wait_for(lambda: "end 1" in _lines(events), timeout=10, message="attempt 1 to finish in its child")

    def second_attempt_running() -> bool:
        t = next(t for t in c.detail(run_id).task_instances if t.task_id == "fenced")
        return t.state == "running" and t.attempt == 2 and "start 2" in _lines(events)

    wait_for(second_attempt_running, timeout=60, message="attempt 2 to run on the other worker")
    detail = c.detail(run_id)
    assert [(a.attempt, a.outcome) for a in detail.attempts] == [(1, "lost")]
    ti = next(t for t in detail.task_instances if t.task_id == "fenced")
    assert ti.worker_id and f"-{workers[other].pid}-" in ti.worker_id

    c.signal(frozen, signal.SIGCONT)
    if finishes_while_paused:

        def late_result() -> str | None:
            return next(a.late_result for a in c.detail(run_id).attempts if a.attempt == 1)

        assert wait_for(late_result, timeout=10, message="the late report") == "late success discarded"
        # The late success was not applied: attempt 2 still owns the task instance.
        ti = next(t for t in c.detail(run_id).task_instances if t.task_id == "fenced")
        assert (ti.state, ti.attempt) == ("running", 2)
        assert "end 2" not in _lines(events)
    else:
        wait_for(
            lambda: not process_alive(first_child), timeout=5, message="the revoked attempt's child to die"
        )

    detail = c.wait_run(run_id, timeout=30)

    assert detail.run.state == "success"
    fenced = [a for a in detail.attempts if a.task_id == "fenced"]
    assert [(a.attempt, a.outcome) for a in fenced] == [(1, "lost"), (2, "success")]
    assert fenced[0].error_type == "LeaseExpired"
    assert fenced[0].worker_id and f"-{workers[frozen].pid}-" in fenced[0].worker_id
    assert fenced[0].late_result == ("late success discarded" if finishes_while_paused else None)
    assert fenced[1].worker_id and f"-{workers[other].pid}-" in fenced[1].worker_id
    assert detail.results == {"fenced": {"attempt": 2}, "downstream": {"attempt": 2}}
    down = [a for a in detail.attempts if a.task_id == "downstream"]
    assert [(a.attempt, a.outcome) for a in down] == [(1, "success")]
    expected = ["start 1", "end 1"] if finishes_while_paused else ["start 1"]
    assert _lines(events) == [*expected, "start 2", "end 2", "downstream 2"]
    # The resumed worker is healthy: it keeps serving.
    assert workers[frozen].poll() is None
    assert c.detail(run_id).run.state == "success"
