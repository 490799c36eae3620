"""Kill -9 chaos (R1, scaled to this machine): three workers run 2,000 task instances on PostgreSQL
while a random worker is SIGKILLed every 2 s and replaced by a fresh process right after.

Every task records one side effect per execution (one O_APPEND write of "run task attempt pid").
Whatever the kills hit, each task instance ends `success`, its successful attempt's effect
happened exactly once, no (task, attempt) ever ran twice, every attempt row is terminal
(`success` or `lost`), nothing is left queued or running, and nothing is dead-lettered.

The kill schedule comes from a seeded RNG (TREADLE_CHAOS_SEED overrides the seed) and is
printed as it happens, so a failing run shows it under "Captured stdout".
"""

from __future__ import annotations

import collections
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import SHORT_LEASE, Cluster
from tests.helpers.wait import wait_for
from treadle.domain.retry import POISON_ORPHAN_LIMIT
from treadle.store.tables import dag_runs, task_attempts, task_instances, workers

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(280)]

CHAINS, STEPS = 500, 4  # 2,000 task instances: 500 independent chains of 4 steps
WORKERS = ("w1", "w2", "w3")
CONCURRENCY = 3  # slots per worker
KILL_EVERY_S = 2.0
CHAOS_MAX_S = 75.0  # the kill loop stops after this, finished or not
SEED = int(os.environ.get("TREADLE_CHAOS_SEED", "20240611"))

CHAOS_DAG = """
    from __future__ import annotations

    import os
    import time
    import zlib

    from treadle import TaskContext, dag, task

    EFFECTS = __EFFECTS__
    CHAINS, STEPS = __CHAINS__, __STEPS__


    def work(context: TaskContext) -> int:
        # 20-200 ms, fixed per task: short next to the 6 s that pass, on average, between two
        # kills of one worker, so three losses of one task instance are practically impossible.
        time.sleep((20 + zlib.crc32(context.task_id.encode()) % 181) / 1000)
        # The side effect: one write(2) on an O_APPEND descriptor, so lines never interleave.
        line = f"{context.run_id} {context.task_id} {context.attempt} {os.getpid()}\\n"
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        return context.attempt


    @dag(dag_id="chaos")
    def chaos() -> None:
        for chain in range(CHAINS):
            previous: list[str] = []
            for step in range(STEPS):
                task_id = f"c{chain:03d}_s{step}"
                # Lost attempts use the retry budget too; the poison limit (3 losses) still holds.
                task(task_id=task_id, depends_on=previous, retries=5, retry_delay=0)(work)()
                previous = [task_id]
"""


@dataclass(frozen=True, slots=True)
class Kill:
    """One entry of the kill schedule."""

    at_s: float  # seconds since the run was triggered (monotonic)
    db_time: str  # the database clock when the kill was sent
    victim: str
    pid: int | None  # None: spared (see `spared_workers`)
    returncode: int | None = None  # -9 unless the worker had already exited by itself

    def line(self) -> str:
        """The entry as one log line."""
        if self.pid is None:
            return (
                f"chaos t={self.at_s:6.2f}s db={self.db_time} spare {self.victim} (holds a twice-lost task)"
            )
        return (
            f"chaos t={self.at_s:6.2f}s db={self.db_time} SIGKILL {self.victim} pid {self.pid} "
            f"exit {self.returncode}"
        )


def run_state(c: Cluster, run_id: str) -> str:
    """The run's state, read cheaply (no task instances)."""
    with c.db.read() as conn:
        return str(conn.execute(sa.select(dag_runs.c.state).where(dag_runs.c.run_id == run_id)).scalar_one())


def db_time(c: Cluster) -> str:
    """The database clock, for the kill log."""
    with c.db.read() as conn:
        return str(conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one())


def spared_workers(c: Cluster, run_id: str) -> set[int]:
    """Pids of workers running an attempt whose task was already orphaned POISON_ORPHAN_LIMIT - 1
    times: one more kill would (correctly) dead-letter it as poison, which is not this test's
    subject, so the chaos loop leaves such a worker alone for that round."""
    with c.db.read() as conn:
        ids = conn.execute(
            sa.select(task_instances.c.worker_id).where(
                task_instances.c.run_id == run_id,
                task_instances.c.state == "running",
                task_instances.c.orphaned_count >= POISON_ORPHAN_LIMIT - 1,
            )
        ).scalars()
        return {int(w.split("-")[-2]) for w in ids if w}


def chaos_loop(c: Cluster, run_id: str, rng: random.Random, started: float) -> list[Kill]:
    """Every KILL_EVERY_S, SIGKILL a random worker and start a fresh one under its name."""
    kills: list[Kill] = []
    next_kill = started + KILL_EVERY_S
    while time.monotonic() - started < CHAOS_MAX_S and run_state(c, run_id) not in ("success", "failed"):
        time.sleep(max(next_kill - time.monotonic(), 0))
        next_kill += KILL_EVERY_S
        victim = rng.choice(WORKERS)  # drawn every round, so the schedule depends on the seed only
        proc = c.procs[victim]
        at, now = time.monotonic() - started, db_time(c)
        if proc.pid in spared_workers(c, run_id):
            kills.append(Kill(at, now, victim, None))
        else:
            c.signal(victim, signal.SIGKILL)
            proc.wait(timeout=10)
            kills.append(Kill(at, now, victim, proc.pid, proc.returncode))
            c.worker(victim, concurrency=CONCURRENCY)
        print(kills[-1].line(), flush=True)
    return kills


def effect_lines(path: Path) -> list[tuple[str, str, int, int]]:
    """(run, task, attempt, pid) of every side effect written."""
    rows = []
    for line in path.read_text().splitlines():
        run, task_id, attempt, pid = line.split()
        rows.append((run, task_id, int(attempt), int(pid)))
    return rows


def test_sigkill_chaos_every_task_instance_succeeds_with_one_effect_per_success(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url, **SHORT_LEASE)
    effects = c.root / "effects.log"
    c.write_dag("chaos.py", CHAOS_DAG, effects=str(effects), chains=CHAINS, steps=STEPS)
    expected = {f"c{chain:03d}_s{step}" for chain in range(CHAINS) for step in range(STEPS)}
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    for name in WORKERS:
        c.worker(name, concurrency=CONCURRENCY)

    def workers_up() -> bool:
        with c.db.read() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(workers)).scalar_one() == len(WORKERS)

    wait_for(workers_up, timeout=60, message="the three workers to register")
    print(f"chaos seed {SEED} (set TREADLE_CHAOS_SEED to replay the same victim sequence)", flush=True)

    run_id = c.trigger("chaos")
    started = time.monotonic()
    kills = chaos_loop(c, run_id, random.Random(SEED), started)
    chaos_s = time.monotonic() - started
    schedule = "\n".join(k.line() for k in kills)
    # Every worker slot is a fresh process now; the rest of the run drains without faults.
    assert all(c.procs[name].poll() is None for name in WORKERS), schedule
    state = wait_for(
        lambda: (s := run_state(c, run_id)) in ("success", "failed") and s,
        timeout=90,
        interval=0.5,
        message=f"run {run_id} to finish after {len(kills)} kills",
    )
    print(
        f"chaos: {len(kills)} rounds in {chaos_s:.1f} s, run {state} after {time.monotonic() - started:.1f} s"
    )

    with c.db.read() as conn:
        tis = conn.execute(
            sa.select(
                task_instances.c.id,
                task_instances.c.task_id,
                task_instances.c.state,
                task_instances.c.attempt,
                task_instances.c.orphaned_count,
                task_instances.c.dead_letter_reason,
                task_instances.c.lease_expires_at,
            ).where(task_instances.c.run_id == run_id)
        ).all()
        attempts = conn.execute(
            sa.select(
                task_attempts.c.task_instance_id,
                task_attempts.c.attempt,
                task_attempts.c.outcome,
                task_attempts.c.error_type,
            ).where(task_attempts.c.run_id == run_id)
        ).all()

    # The chaos really happened and really hit running attempts.
    sent = [k for k in kills if k.pid is not None]
    lost = [a for a in attempts if a.outcome == "lost"]
    assert len(sent) >= 5, schedule
    # Each victim was alive until the kill: no worker died by itself under the chaos.
    assert {k.returncode for k in sent} == {-signal.SIGKILL}, schedule
    assert lost, f"no attempt was lost: the kills never hit a running task\n{schedule}"
    print(f"chaos: {len(sent)} kills, {len(lost)} attempts lost, {len(attempts)} attempts in all")

    # Every task instance ended success; none queued, running, waiting or dead-lettered.
    assert state == "success", schedule
    assert {t.task_id for t in tis} == expected and len(tis) == 2_000
    states = collections.Counter(t.state for t in tis)
    assert states == {"success": 2_000}, f"{states}\n{schedule}"
    assert [t.task_id for t in tis if t.dead_letter_reason is not None] == []
    assert [t.task_id for t in tis if t.lease_expires_at is not None] == []
    assert max(t.orphaned_count for t in tis) < POISON_ORPHAN_LIMIT

    # History: attempts 1..n of each task instance, all terminal; the last one (only) succeeded,
    # the others were lost to the kills, and orphaned_count counts exactly those losses.
    by_ti: dict[int, list[tuple[int, str, str | None]]] = collections.defaultdict(list)
    for a in attempts:
        by_ti[a.task_instance_id].append((a.attempt, a.outcome, a.error_type))
    assert {a.outcome for a in attempts} <= {"success", "lost"}, collections.Counter(
        a.outcome for a in attempts
    )
    for t in tis:
        history = sorted(by_ti[t.id])
        assert [n for n, _, _ in history] == list(range(1, t.attempt + 1)), (t.task_id, history)
        assert [o for _, o, _ in history] == ["lost"] * (t.attempt - 1) + ["success"], (t.task_id, history)
        assert {e for _, o, e in history if o == "lost"} <= {"LeaseExpired"}, (t.task_id, history)
        assert t.orphaned_count == t.attempt - 1, (t.task_id, t.orphaned_count, history)

    # Side effects: never two executions of one (task, attempt); each task's successful attempt
    # wrote its effect exactly once; every effect belongs to a recorded attempt of this run.
    lines = effect_lines(effects)
    per_attempt = collections.Counter((task_id, attempt) for _, task_id, attempt, _ in lines)
    twice = {k: n for k, n in per_attempt.items() if n > 1}
    assert twice == {}, f"(task, attempt) executed more than once: {twice}\n{schedule}"
    assert {run for run, _, _, _ in lines} == {run_id}
    recorded = {(t.task_id, n) for t in tis for n, _, _ in by_ti[t.id]}
    assert set(per_attempt) <= recorded, set(per_attempt) - recorded
    successful = {(t.task_id, t.attempt) for t in tis}
    assert {k: per_attempt.get(k, 0) for k in successful} == dict.fromkeys(successful, 1)
    from_lost = len(lines) - len(successful)
    print(f"chaos: {len(lines)} effect lines, {from_lost} from lost attempts")
