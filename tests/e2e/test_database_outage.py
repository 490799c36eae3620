"""A database outage longer than the lease re-runs only attempts that had not finished.

A private PostgreSQL server (its own data folder and port) is stopped with `-m immediate`, killed
with SIGKILL, or frozen whole with SIGSTOP in the middle of a run, for several leases. Workers
keep the outcomes of attempts that finished meanwhile and record them once the database is back
(the writes are fenced, so retrying them is safe); attempts still running when the workers
stopped trusting their leases were killed and run again; the scheduler waits one lease after
the outage before it reaps, so workers can renew first. Every task writes one line when it
starts and one when it ends.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import SHORT_LEASE, Cluster
from tests.helpers.outage import EFFECT_DAG, read_effects, wait_out
from tests.helpers.private_pg import PrivatePostgres
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(280)]

TASKS = 240
OUTAGE_S = 10.0  # more than three leases, and more than the store's own retries (~7 s)


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    if os.geteuid() == 0 and not Path("/usr/sbin/runuser").exists() and not Path("/sbin/runuser").exists():
        pytest.skip("running as root needs runuser to start PostgreSQL as the postgres user")
    server = PrivatePostgres()
    yield server
    server.close()


@pytest.mark.parametrize("fault", ["immediate-stop", "kill-9", "stall"])
def test_an_outage_longer_than_the_lease_reruns_only_unfinished_attempts(
    private_pg: PrivatePostgres, cluster: Callable[..., Cluster], fault: str
) -> None:
    c = cluster(private_pg.url, **SHORT_LEASE)  # lease 3 s, heartbeat 1 s
    effects = c.root / "effects.log"
    c.write_dag("outage.py", EFFECT_DAG, effects=str(effects), tasks=TASKS)
    assert c.cli("db", "upgrade").returncode == 0
    assert c.cli("dags", "sync").returncode == 0
    procs = [c.start("scheduler", "scheduler"), c.worker("w1", concurrency=4), c.worker("w2", concurrency=4)]
    run_id = c.trigger("outage")
    wait_for(lambda: sum(e[0] == "end" for e in read_effects(effects)) >= 40, timeout=90, message="progress")

    ended_during = _outage(private_pg, fault)
    c.db.dispose()  # the test's own pool holds connections the outage broke

    detail = c.wait_run(run_id, timeout=180)
    assert detail.run.state == "success", {t.task_id: t.state for t in detail.task_instances}
    assert all(p.poll() is None for p in procs), "a process exited during the outage"

    seen = read_effects(effects)
    ends = collections.Counter(task_id for what, task_id, _ in seen if what == "end")
    assert set(ends) == {f"t{n}" for n in range(TASKS)}
    twice = {t: n for t, n in ends.items() if n > 1}
    assert not twice, f"finished work ran again after the outage: {twice}"
    # The scenario did hold finished outcomes through the outage and recorded them afterwards
    # (in a stall the write just waits, unanswered, and goes through on resume).
    logs = c.log("w1") + c.log("w2")
    if fault != "stall":
        assert "worker.outcome_held" in logs and "worker.outcome_recorded" in logs, ended_during
    # Attempts still running when their workers stopped trusting their leases were killed then
    # (a start without an end) and ran again; short ones finished first and kept their outcomes.
    killed = {(t, a) for what, t, a in seen if what == "start"} - {
        (t, a) for what, t, a in seen if what == "end"
    }
    if killed:
        assert "self-fenced" in logs, killed
    assert "scheduler.deadlines_held" in c.log("scheduler")


def _outage(server: PrivatePostgres, fault: str) -> float:
    """Take the server away for OUTAGE_S by `fault`, then bring it back; returns the seconds."""
    if fault == "stall":
        frozen = server.stall()
        took = wait_out(OUTAGE_S)
        server.resume(frozen)
        return took
    if fault == "kill-9":
        gone = server.kill()
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in gone), timeout=30, message="exit")
    else:
        server.stop("immediate")
    took = wait_out(OUTAGE_S)
    server.start()
    return took


def test_a_restart_shorter_than_the_lease_starts_no_attempt_twice(
    private_pg: PrivatePostgres, cluster: Callable[..., Cluster]
) -> None:
    """`pg_ctl restart -m fast` takes a second or two, well inside the lease: nothing is killed,
    nothing is reaped, every task starts exactly once."""
    c = cluster(private_pg.url, TREADLE_LEASE_SECONDS="12", TREADLE_HEARTBEAT_SECONDS="1")
    effects = c.root / "effects.log"
    c.write_dag("outage.py", EFFECT_DAG, effects=str(effects), tasks=TASKS // 2)
    assert c.cli("db", "upgrade").returncode == 0
    assert c.cli("dags", "sync").returncode == 0
    procs = [c.start("scheduler", "scheduler"), c.worker("w1", concurrency=4), c.worker("w2", concurrency=4)]
    run_id = c.trigger("outage")
    wait_for(lambda: sum(e[0] == "end" for e in read_effects(effects)) >= 20, timeout=90, message="progress")

    private_pg.stop("fast")
    private_pg.start()
    c.db.dispose()

    detail = c.wait_run(run_id, timeout=180)
    assert detail.run.state == "success", {t.task_id: t.state for t in detail.task_instances}
    assert all(p.poll() is None for p in procs), "a process exited during the restart"
    starts = collections.Counter(task_id for what, task_id, _ in read_effects(effects) if what == "start")
    assert {t: n for t, n in starts.items() if n > 1} == {}, "an attempt started twice"
    assert not [a for a in detail.attempts if a.outcome == "lost"]
