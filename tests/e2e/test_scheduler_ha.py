"""Several `treadle scheduler` processes on one PostgreSQL database: one leads, the others stand
by; SIGKILLing the leader hands over within seconds, and every schedule slot gets exactly one run."""

from __future__ import annotations

import itertools
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlalchemy.engine import Connection

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.engine import queries
from treadle.engine.pausing import set_paused
from treadle.store import leases as lease_store
from treadle.store.database import db_now

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

EVERY_SECOND_DAGS = """
    from __future__ import annotations

    from datetime import timedelta

    from treadle import dag, task


    @task
    def tick() -> int:
        return 1


    for n in range(__COUNT__):
        @dag(dag_id=f"every_second_{n}", schedule=timedelta(seconds=1), catchup=True, max_active_runs=1000)
        def every_second() -> None:
            tick()
"""

#: A short leader lease so takeovers are quick; the standby polls twice a second.
HA_ENV = {"TREADLE_SCHEDULER_LEASE_SECONDS": "2"}


def _slots(c: Cluster) -> dict[str, list[datetime]]:
    """Nominal fire times of every scheduled run, per DAG, in order."""
    fires: dict[str, list[datetime]] = defaultdict(list)
    for run in queries.list_runs(c.db, limit=100_000):
        if run.run_type == "scheduled":
            assert run.data_interval_end is not None
            fires[run.dag_id].append(run.data_interval_end)
    return {k: sorted(v) for k, v in fires.items()}


def _assert_every_slot_exactly_once(c: Cluster, dag_count: int) -> dict[str, list[datetime]]:
    fires = _slots(c)
    assert len(fires) == dag_count
    for dag_id, times in fires.items():
        assert len(times) == len(set(times)), f"{dag_id}: a slot fired twice"
        gaps = [b - a for a, b in itertools.pairwise(times) if b - a != timedelta(seconds=1)]
        assert not gaps, f"{dag_id}: slots missing between fires: {gaps}"
    return fires


def _leader_pid(c: Cluster) -> tuple[int, int]:
    def current() -> tuple[int, int] | None:
        def read(conn: Connection) -> tuple[int, int] | None:
            lease = lease_store.get(conn, "scheduler")
            if lease is None or lease.holder is None or lease.expires_at is None:
                return None
            if lease.expires_at <= db_now(conn):
                return None
            return int(lease.holder.split(":")[1]), lease.epoch

        return c.db.query(read)

    return wait_for(current, timeout=20, interval=0.1, message="a scheduler to lead")


def _pause_all(c: Cluster, count: int) -> None:
    assert c.cli("dags", "pause", "every_second_0").returncode == 0  # the CLI path, once
    for n in range(1, count):
        set_paused(c.db, f"every_second_{n}", paused=True, actor="test")


def test_two_racing_schedulers_create_exactly_one_run_per_slot(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url, **HA_ENV)
    count = 20
    c.write_dag("every_second.py", EVERY_SECOND_DAGS, count=count)
    assert c.cli("dags", "sync").returncode == 0
    c.start("s1", "scheduler")
    c.start("s2", "scheduler")
    wait_for(lambda: len(_slots(c)) == count and min(map(len, _slots(c).values())) >= 6, timeout=40)
    _pause_all(c, count)
    time.sleep(1.5)
    fires = _assert_every_slot_exactly_once(c, count)
    assert min(len(v) for v in fires.values()) >= 6
    # Only one of the two ever led (nobody died), and every run carries its epoch.
    epochs = {r.leader_epoch for r in queries.list_runs(c.db, limit=100_000)}
    assert len(epochs) == 1


def test_sigkilled_leader_is_replaced_within_seconds_and_no_slot_is_missed_or_doubled(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url, **HA_ENV)
    count = 10
    c.write_dag("every_second.py", EVERY_SECOND_DAGS, count=count)
    assert c.cli("dags", "sync").returncode == 0
    names = ["s1", "s2", "s3"]
    for name in names:
        c.start(name, "scheduler")
    wait_for(lambda: len(_slots(c)) == count, timeout=30, message="first runs")

    takeovers, kills = [], []
    for _ in range(2):
        pid, epoch = _leader_pid(c)
        victim = next(n for n in names if c.procs[n].pid == pid)
        killed_at = c.db.query(db_now)
        kills.append(killed_at)
        c.signal(victim, signal.SIGKILL)
        c.procs[victim].wait(timeout=10)

        def new_leader_fired(old_epoch: int = epoch) -> datetime | None:
            newer = [
                r.created_at
                for r in queries.list_runs(c.db, limit=200)
                if r.leader_epoch is not None and r.leader_epoch > old_epoch
            ]
            return min(newer) if newer else None

        first_new = wait_for(new_leader_fired, timeout=20, interval=0.1, message="the new leader to fire")
        takeovers.append((first_new - killed_at).total_seconds())
        c.start(victim, "scheduler")  # back as a standby

    print(f"takeovers (kill -> first run of the new leader, DB clock): {takeovers}")
    assert max(takeovers) < 5.0, takeovers
    time.sleep(1.5)
    _pause_all(c, count)
    time.sleep(1.5)
    fires = _assert_every_slot_exactly_once(c, count)
    # Every DAG's slots run contiguously from before the first kill to after the last one:
    # catch-up filled the gaps the dead leaders left.
    for times in fires.values():
        assert times[0] < kills[0] and times[-1] > kills[-1], (times, kills)
    epochs = {r.leader_epoch for r in queries.list_runs(c.db, limit=100_000)}
    assert len(epochs) >= 3


def test_sigterm_hands_leadership_over_at_once(pg_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(pg_url, TREADLE_SCHEDULER_LEASE_SECONDS="30")
    count = 3
    c.write_dag("every_second.py", EVERY_SECOND_DAGS, count=count)
    assert c.cli("dags", "sync").returncode == 0
    c.start("s1", "scheduler")
    c.start("s2", "scheduler")
    wait_for(lambda: len(_slots(c)) == count, timeout=30, message="first runs")
    pid, epoch = _leader_pid(c)
    leader = next(n for n in ("s1", "s2") if c.procs[n].pid == pid)
    stopped_at = c.db.query(db_now)
    c.signal(leader, signal.SIGTERM)
    c.procs[leader].wait(timeout=20)

    def new_leader_fired() -> datetime | None:
        newer = [r.created_at for r in queries.list_runs(c.db, limit=200) if (r.leader_epoch or 0) > epoch]
        return min(newer) if newer else None

    # With a 30 s lease, only the released lease explains a takeover this fast.
    first_new = wait_for(new_leader_fired, timeout=10, interval=0.05, message="the standby to take over")
    assert (first_new - stopped_at).total_seconds() < 3.0
    _pause_all(c, count)
    time.sleep(1.0)
    _assert_every_slot_exactly_once(c, count)
