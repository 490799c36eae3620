"""A MariaDB restart or outage in the middle of a run: nothing that finished runs twice.

The same guarantees as test_database_outage.py gives on PostgreSQL, on a private MariaDB server
(its own data folder and port; the shared one is never touched):

* a clean restart that takes less than the lease starts no attempt twice and loses none;
* the server killed with SIGKILL, or frozen whole with SIGSTOP, for several leases: workers
  keep the outcomes of attempts that finished meanwhile and record them once the server is
  back, attempts still running when the workers stopped trusting their leases are killed and
  run again, the scheduler holds its deadlines one lease after the outage, and every treadle
  process stays up.

Every task writes one line when it starts and one when it ends (tests/helpers/outage.py).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.conftest import SHORT_LEASE, Cluster
from tests.helpers.outage import EFFECT_DAG, ended, read_effects, wait_out
from tests.helpers.private_mariadb import PrivateMariaDB, find_binaries
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.mysql, pytest.mark.timeout(240)]

TASKS = 240
OUTAGE_S = 10.0  # more than three leases, and more than the store's own retries (~7 s)


@pytest.fixture
def private_mariadb() -> Iterator[PrivateMariaDB]:
    if find_binaries() is None:
        pytest.skip("MariaDB binaries not found (mariadb-install-db and mariadbd, package mariadb-server)")
    server = PrivateMariaDB()
    try:
        yield server
    finally:
        server.close()


def _start_cluster(
    server: PrivateMariaDB, cluster: Callable[..., Cluster], tasks: int, **env: str
) -> Cluster:
    c = cluster(server.create_database("treadle"), **env)
    c.write_dag("outage.py", EFFECT_DAG, effects=str(c.root / "effects.log"), tasks=tasks)
    assert c.cli("db", "upgrade").returncode == 0
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("w1", concurrency=4)
    c.worker("w2", concurrency=4)
    return c


def test_a_restart_shorter_than_the_lease_starts_no_attempt_twice(
    private_mariadb: PrivateMariaDB, cluster: Callable[..., Cluster]
) -> None:
    """A clean shutdown and start takes a second or two, well inside the lease: nothing is
    killed, nothing is reaped, every task starts exactly once."""
    c = _start_cluster(
        private_mariadb, cluster, TASKS // 2, TREADLE_LEASE_SECONDS="12", TREADLE_HEARTBEAT_SECONDS="1"
    )
    effects = c.root / "effects.log"
    run_id = c.trigger("outage")
    wait_for(lambda: ended(effects) >= 20, timeout=90, message="progress")

    began = time.monotonic()
    private_mariadb.restart("fast")
    took = f"the restart took {time.monotonic() - began:.1f} s (lease 12 s)"
    c.db.dispose()  # the test's own pool holds connections the restart closed

    detail = c.wait_run(run_id, timeout=150)
    assert detail.run.state == "success", {t.task_id: t.state for t in detail.task_instances}
    assert all(p.poll() is None for p in c.procs.values()), "a process exited during the restart"
    starts = collections.Counter(task_id for what, task_id, _ in read_effects(effects) if what == "start")
    assert set(starts) == {f"t{n}" for n in range(TASKS // 2)}
    assert {t: n for t, n in starts.items() if n > 1} == {}, f"an attempt started twice; {took}"
    assert not [a for a in detail.attempts if a.outcome == "lost"], took


@pytest.mark.parametrize("fault", ["kill-9", "stall"])
def test_an_outage_longer_than_the_lease_reruns_only_unfinished_attempts(
    private_mariadb: PrivateMariaDB, cluster: Callable[..., Cluster], fault: str
) -> None:
    c = _start_cluster(private_mariadb, cluster, TASKS, **SHORT_LEASE)  # lease 3 s, heartbeat 1 s
    effects = c.root / "effects.log"
    run_id = c.trigger("outage")
    wait_for(lambda: ended(effects) >= 40, timeout=90, message="progress")

    ended_before = ended(effects)
    took = _outage(private_mariadb, fault)
    ended_during = ended(effects) - ended_before
    c.db.dispose()  # the test's own pool holds connections the outage broke

    detail = c.wait_run(run_id, timeout=150)
    assert detail.run.state == "success", {t.task_id: t.state for t in detail.task_instances}
    assert all(p.poll() is None for p in c.procs.values()), "a process exited during the outage"

    seen = read_effects(effects)
    ends = collections.Counter(task_id for what, task_id, _ in seen if what == "end")
    assert set(ends) == {f"t{n}" for n in range(TASKS)}
    twice = {t: n for t, n in ends.items() if n > 1}
    how = [
        f"{a.task_id}#{a.attempt} {a.outcome}: {a.error_message}"
        for a in detail.attempts
        if a.task_id in twice
    ]
    assert not twice, f"finished work ran again after the outage: {twice}\n" + "\n".join(how)
    # Finished outcomes were held through the outage and recorded afterwards (in a stall the
    # write just waits, unanswered, and goes through on resume).
    logs = c.log("w1") + c.log("w2")
    if fault != "stall":
        why = f"{ended_during} attempts ended during the {took:.1f} s outage"
        assert "worker.outcome_held" in logs and "worker.outcome_recorded" in logs, why
    assert "self-fenced" in logs  # running attempts were stopped before their leases expired
    assert "scheduler.deadlines_held" in c.log("scheduler")


def _outage(server: PrivateMariaDB, fault: str) -> float:
    """Take the server away for OUTAGE_S by `fault`, then bring it back; returns the seconds."""
    if fault == "stall":
        server.stall()  # every thread frozen: calls in flight get no answer, nothing errors
        took = wait_out(OUTAGE_S)
        server.resume()
        return took
    server.kill()  # SIGKILL, reaped: every connection is gone, new ones are refused
    took = wait_out(OUTAGE_S)
    server.start()  # InnoDB crash recovery, same port and data
    return took
