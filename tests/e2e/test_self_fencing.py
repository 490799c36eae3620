"""A worker fences itself however its database calls hang, and its buffer never runs stale work.

* Hung heartbeat: the worker's path to PostgreSQL freezes mid-attempt (a proxy stops carrying
  bytes: no error, no answer). Its lease lapses, the reaper records the attempt lost and a
  second worker starts attempt 2. Attempt 1 must be dead before attempt 2 starts: its process
  tree is killed by the worker's watchdog within the lease, not when a call returns.
* Prefetch: an attempt cancelled while it waits in a worker's buffer never starts.

Both on PostgreSQL and on MariaDB.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import SHORT_LEASE, Cluster, process_alive
from tests.helpers.proxy import FreezableProxy
from tests.helpers.wait import wait_for
from treadle.store.tables import task_instances

pytestmark = [pytest.mark.e2e]

#: The database servers, and the port each listens on.
SERVERS = [
    pytest.param(("pg_url", 5432), marks=pytest.mark.postgres, id="postgresql"),
    pytest.param(("mysql_url", 3306), marks=pytest.mark.mysql, id="mariadb"),
]


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> tuple[str, int]:
    """(database URL, server port) of a fresh database on each server."""
    fixture, port = request.param
    url: str = request.getfixturevalue(fixture)
    return url, port


TICKER_DAG = """
    from __future__ import annotations

    import os
    import time

    from treadle import TaskContext, dag, task

    TICKS = __TICKS__
    PIDS = __PIDS__


    @task(retries=2, retry_delay=0)
    def ticker(context: TaskContext) -> int:
        with open(os.path.join(PIDS, f"ticker-{context.attempt}"), "w") as f:
            f.write(str(os.getpid()))
        # One O_APPEND write per tick: "attempt monotonic-time" (one clock for every process here).
        end = time.monotonic() + 8
        while time.monotonic() < end:
            fd = os.open(TICKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{context.attempt} {time.monotonic():.3f}\\n".encode())
            os.close(fd)
            time.sleep(0.1)
        return context.attempt


    @dag(dag_id="ticking")
    def ticking() -> None:
        ticker()
"""


def _ticks(path: Path) -> dict[int, list[float]]:
    seen: dict[int, list[float]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        attempt, at = line.split()
        seen.setdefault(int(attempt), []).append(float(at))
    return seen


@pytest.fixture
def frozen_path(server: tuple[str, int]) -> Iterator[FreezableProxy]:
    proxy = FreezableProxy(("127.0.0.1", server[1]))
    yield proxy
    proxy.close()


def test_a_hung_database_call_never_lets_two_attempts_run_at_once(
    server: tuple[str, int], cluster: Callable[..., Cluster], frozen_path: FreezableProxy
) -> None:
    url, port = server
    c = cluster(url, **SHORT_LEASE)  # lease 3 s, heartbeat 1 s
    ticks = c.root / "ticks.log"
    c.write_dag("ticking.py", TICKER_DAG, ticks=str(ticks), pids=str(c.pids))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    via_proxy = url.replace(f"127.0.0.1:{port}", f"127.0.0.1:{frozen_path.port}")
    assert via_proxy != url
    c.start("w1", "worker", env={"TREADLE_DATABASE_URL": via_proxy})

    run_id = c.trigger("ticking")
    wait_for(lambda: 1 in _ticks(ticks), timeout=60, message="attempt 1 to tick")
    first_child = int((c.pids / "ticker-1").read_text())
    c.worker("w2")  # after attempt 1 started, so that w1 holds it

    frozen_path.frozen.set()  # every call of w1 (heartbeat included) now hangs, unanswered
    # A few ticks of attempt 2, so that a surviving attempt 1 would have ticked meanwhile. If
    # the freeze caught w1 inside a transaction, the server keeps its row locked, and the reaper
    # waits, until it ends the idle transaction (IDLE_IN_TRANSACTION_S, 60 s).
    wait_for(lambda: len(_ticks(ticks).get(2, [])) >= 5, timeout=180, message="attempt 2 to run on w2")

    seen = _ticks(ticks)
    assert max(seen[1]) < min(seen[2]), "attempt 1 still ran after attempt 2 had started"
    assert not process_alive(first_child), "attempt 1's process outlived its lease"
    assert "self-fenced" in c.log("w1")

    frozen_path.frozen.clear()
    detail = c.wait_run(run_id, timeout=60)
    assert detail.run.state == "success"
    outcomes = [(a.attempt, a.outcome) for a in detail.attempts]
    assert outcomes == [(1, "lost"), (2, "success")]


BUFFER_DAG = """
    from __future__ import annotations

    import os
    import time

    from treadle import dag, task

    EVENTS = __EVENTS__
    RELEASE = __RELEASE__


    def note(line: str) -> None:
        fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (line + "\\n").encode())
        os.close(fd)


    @task(priority_weight=10)
    def slow() -> None:
        note("slow started")
        end = time.monotonic() + 60
        while not os.path.exists(RELEASE) and time.monotonic() < end:
            time.sleep(0.05)


    @task(priority_weight=1)
    def victim() -> None:
        note("victim ran")


    @dag(dag_id="buffered")
    def buffered() -> None:
        slow()
        victim()
"""


def test_an_attempt_cancelled_in_the_prefetch_buffer_never_starts(
    server: tuple[str, int], cluster: Callable[..., Cluster]
) -> None:
    c = cluster(server[0], **SHORT_LEASE)
    events, release = c.root / "events.log", c.root / "release"
    c.write_dag("buffered.py", BUFFER_DAG, events=str(events), release=str(release))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "1", "--prefetch", "1")

    run_id = c.trigger("buffered")
    wait_for(lambda: events.exists() and "slow started" in events.read_text(), timeout=60, message="slow")

    def victim_row() -> sa.Row | None:  # type: ignore[type-arg]
        with c.db.read() as conn:
            return conn.execute(
                sa.select(
                    task_instances.c.state, task_instances.c.started_at, task_instances.c.worker_id
                ).where(task_instances.c.run_id == run_id, task_instances.c.task_id == "victim")
            ).first()

    buffered = wait_for(
        lambda: (r := victim_row()) is not None and r.state == "running" and r, timeout=60, message="prefetch"
    )
    assert buffered.started_at is None and buffered.worker_id  # claimed into the buffer, not started

    done = c.cli("tasks", "cancel", run_id, "victim", "--reason", "not needed")
    assert done.returncode == 0, done.stderr
    release.touch()

    detail = c.wait_run(run_id, timeout=60)
    states = {t.task_id: t.state for t in detail.task_instances}
    assert states == {"slow": "success", "victim": "cancelled"}
    # The worker is idle again (nothing running, nothing buffered) and the victim never ran.
    wait_for(
        lambda: all(w["active"] == 0 and w["prefetched"] == 0 for w in c.cli_json("workers")),
        timeout=30,
        message="the worker to be idle",
    )
    assert "victim ran" not in events.read_text()
    [cancelled] = [a for a in detail.attempts if a.task_id == "victim"]
    assert (cancelled.outcome, cancelled.started_at) == ("cancelled", None)


LONG_DAG = """
    from __future__ import annotations

    import os
    import time

    from treadle import dag, task

    EVENTS = __EVENTS__
    RELEASE = __RELEASE__


    @task(retries=2, retry_delay=0)
    def long() -> None:
        with open(EVENTS, "a") as f:
            f.write("started\\n")
        end = time.monotonic() + 120
        while not os.path.exists(RELEASE) and time.monotonic() < end:
            time.sleep(0.05)


    @dag(dag_id="held")
    def held() -> None:
        long()
"""


def test_a_row_held_briefly_by_another_transaction_does_not_fence_its_attempt(
    server: tuple[str, int], cluster: Callable[..., Cluster]
) -> None:
    """A transaction that holds an attempt's row for a fraction of the trust window (a dispatch
    pass, a scheduler pass, a cut-off worker's late renewal) makes a renewal skip the row; the
    worker tries the row again soon after instead of a heartbeat later, so the attempt keeps
    its lease. (Lease 6 s, heartbeat 2 s: the watchdog fences 4 s after the last renewal sent;
    before, one skipped renewal and the next beat raced the watchdog.)"""
    c = cluster(server[0], TREADLE_LEASE_SECONDS="6", TREADLE_HEARTBEAT_SECONDS="2")
    events, release = c.root / "events.log", c.root / "release"
    c.write_dag("held.py", LONG_DAG, events=str(events), release=str(release))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("w1")
    run_id = c.trigger("held")
    wait_for(lambda: events.exists() and "started" in events.read_text(), timeout=60, message="the attempt")
    [row_id] = [t.id for t in c.detail(run_id).task_instances]

    for _ in range(4):  # each hold overlaps a beat half the time: four make a miss unlikely
        with c.db.engine.connect() as other, other.begin():
            other.execute(
                sa.select(task_instances.c.id).where(task_instances.c.id == row_id).with_for_update()
            ).all()
            time.sleep(1.0)  # the hold itself is the scenario: a quarter of the trust window
        time.sleep(1.0)

    release.touch()
    detail = c.wait_run(run_id, timeout=60)
    assert [(a.attempt, a.outcome) for a in detail.attempts] == [(1, "success")]
    assert "self-fenced" not in c.log("w1")
