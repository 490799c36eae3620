"""Scheduler failover: SIGKILL the leader, time the standby's takeover (`--only failover`).

`schedulers` `treadle scheduler` processes, one worker, and `dags` DAGs of one no-op task on a
1-second interval with catchup on. Once the first leader has fired for `warmup_s`, each of
`repeats` rounds:

1. reads the `scheduler` lease (holder `host:pid:rand`, epoch) and matches the pid to one of the
   scheduler processes started here;
2. reads the database clock and at once SIGKILLs that process's group, then reads the clock
   again (the kill lies between the two; the first is used);
3. waits for the first run with `dag_runs.leader_epoch` above the killed leader's epoch.
   Takeover = that run's `created_at` - the kill (database clock; target < 5 s). Also: when the
   new epoch's lease was acquired (`leases.acquired_at`), and how many runs its first firing
   created (the slots missed while no one led, caught up);
4. before the next round, restarts the killed scheduler as a new standby, waits until it uses
   the database (timed), then lets `gap_s` pass.

At the end every DAG must have exactly one run per whole second from its first slot to two
seconds before the end (catch-up included): missed and duplicated slots are counted. The same
processes on both backends (on SQLite they share the file); the worker registers the DAGs.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from treadle.bench.db import Rows
from treadle.bench.harness import count_in_logs, migrate, wait_for
from treadle.bench.scheduling import (
    QUIET,
    STARTUP_S,
    Cluster,
    holder_pid,
    seconds_from,
    slot_audit,
    write_scheduled_dags,
)
from treadle.store.tables import dag_runs, leases

PREFIX = "bench_fo"


@dataclass(frozen=True, slots=True, kw_only=True)
class FailoverOptions:
    """How many schedulers, DAGs and kills."""

    schedulers: int = 2
    dags: int = 20
    repeats: int = 5
    gap_s: float = 4.0
    warmup_s: float = 4.0
    slots: int = 16
    #: TREADLE_SCHEDULER_LEASE_SECONDS.
    lease_s: float = 3.0
    timeout_s: float = 30.0
    progress: Callable[[str], None] = QUIET


class Schedulers:
    """The scheduler processes, by slot; a killed one is replaced by a new process in its slot."""

    def __init__(self, cluster: Cluster, count: int) -> None:
        self.cluster = cluster
        self.current: list[subprocess.Popen[bytes]] = []
        self.current_logs: list[Path] = []
        #: Every scheduler log, killed processes' included.
        self.logs: list[Path] = []
        for slot in range(count):
            self.current.append(self._start(slot))
            self.current_logs.append(self.logs[-1])

    def _start(self, slot: int) -> subprocess.Popen[bytes]:
        name = f"scheduler{slot}_{len(self.logs)}"
        self.logs.append(self.cluster.log(name))
        return self.cluster.start(name, ["scheduler"])

    def slot_of(self, pid: int | None) -> int | None:
        """Which slot runs process `pid` (None: not one of ours)."""
        return next((i for i, p in enumerate(self.current) if p.pid == pid), None)

    def replace(self, slot: int) -> subprocess.Popen[bytes]:
        """Start a new scheduler in `slot` (its previous process was killed)."""
        self.current[slot] = self._start(slot)
        self.current_logs[slot] = self.logs[-1]
        return self.current[slot]

    def check_alive(self, worker: subprocess.Popen[bytes], worker_log: Path) -> None:
        """Raise if the worker or a current (not deliberately killed) scheduler has exited."""
        for proc, log in [(worker, worker_log), *zip(self.current, self.current_logs, strict=True)]:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"a treadle process exited with {proc.returncode}:\n{tail}")


def measure_failover(root: Path, url: str, options: FailoverOptions) -> dict[str, Any]:
    """Kill the leader `repeats` times on a fresh database (`url`, empty); returns the figures."""
    if options.schedulers < 2:
        raise ValueError("failover needs at least 2 schedulers (one leader, one standby)")
    began = time.monotonic()
    cluster = Cluster(root, url, TREADLE_SCHEDULER_LEASE_SECONDS=str(options.lease_s))
    ids = write_scheduled_dags(
        cluster.folder, prefix=PREFIX, count=options.dags, schedule="timedelta(seconds=1)", catchup=True
    )
    scheds: Schedulers | None = None
    try:
        migrate(cluster.url)
        worker = cluster.start("worker", ["worker", "--concurrency", str(options.slots)])
        scheds = Schedulers(cluster, options.schedulers)
        bdb = cluster.bdb

        def alive() -> None:
            assert scheds is not None
            scheds.check_alive(worker, cluster.log("worker"))

        def fired() -> bool:
            alive()
            return bdb.scalar(sa.select(dag_runs.c.run_id).limit(1)) is not None

        wait_for("a first scheduled run", fired, timeout=STARTUP_S)
        for proc in scheds.current:
            wait_for(
                "every scheduler's database session", partial(bdb.has_session, proc.pid), timeout=STARTUP_S
            )
        time.sleep(options.warmup_s)
        rounds = []
        for n in range(options.repeats):
            options.progress(f"failover: kill {n + 1} of {options.repeats}")
            alive()
            last = n + 1 == options.repeats
            rounds.append(kill_round(cluster, scheds, options.timeout_s, restart=not last))
            if not last:
                time.sleep(options.gap_s)
        # Every slot up to two seconds ago must have its run by now (catch-up included).
        last_slot = (bdb.now() - timedelta(seconds=2)).replace(microsecond=0)
        rows = bdb.rows(
            sa.select(dag_runs.c.dag_id, dag_runs.c.data_interval_end, dag_runs.c.leader_epoch).where(
                dag_runs.c.run_type == "scheduled"
            )
        )
        step_errors = count_in_logs(scheds.logs, '"scheduler.step_error"')
    except BaseException:
        cluster.dump_logs()
        raise
    finally:
        cluster.stop()
    return _figures(ids, options, rounds, rows, last_slot, step_errors, began)


def first_run_of_epoch_after(cluster: Cluster, epoch: int) -> tuple[datetime, int] | None:
    """(earliest created_at, epoch) of runs created under a leader epoch above `epoch`."""
    r = dag_runs
    found = cluster.bdb.rows(
        sa.select(r.c.created_at, r.c.leader_epoch)
        .where(r.c.leader_epoch > epoch)
        .order_by(r.c.created_at, r.c.leader_epoch)
        .limit(1)
    )
    return (found[0][0], int(found[0][1])) if found else None


def kill_round(cluster: Cluster, scheds: Schedulers, timeout: float, *, restart: bool) -> dict[str, Any]:
    """Kill the leader and time the takeover; returns the round's figures. With `restart`, the
    killed scheduler is started again (the next round's standby) and its start-up timed."""
    bdb = cluster.bdb
    lease = bdb.lease()
    holder, epoch = (lease.holder, lease.epoch) if lease else (None, 0)
    pid = holder_pid(holder)
    slot = scheds.slot_of(pid)
    if slot is None:
        raise RuntimeError(f"the lease holder {holder!r} is none of the schedulers started here")
    victim = scheds.current[slot]
    before = bdb.now()
    os.killpg(victim.pid, signal.SIGKILL)
    after = bdb.now()
    victim.wait(timeout=10)
    deadline = time.monotonic() + timeout
    while (found := first_run_of_epoch_after(cluster, epoch)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no run under a new leader {timeout:.0f} s after killing epoch {epoch}")
        time.sleep(0.02)
    created, new_epoch = found
    row = bdb.rows(
        sa.select(leases.c.holder, leases.c.acquired_at).where(
            leases.c.name == "scheduler", leases.c.epoch >= new_epoch
        )
    )
    new_holder, acquired = (row[0][0], row[0][1]) if row else (None, None)
    # The first firing of the new epoch: its runs share the firing transaction's clock.
    firing = [
        end
        for made, end in bdb.rows(
            sa.select(dag_runs.c.created_at, dag_runs.c.data_interval_end).where(
                dag_runs.c.leader_epoch == new_epoch
            )
        )
        if made == created
    ]
    figures = {
        "killed_epoch": epoch,
        "killed_pid": pid,
        "new_epoch": new_epoch,
        "new_leader_pid": holder_pid(new_holder),
        "kill_clock_bracket_ms": round((after - before).total_seconds() * 1000, 2),
        "lease_taken_after_s": round((acquired - before).total_seconds(), 3) if acquired else None,
        "first_run_after_s": round((created - before).total_seconds(), 3),
        "first_firing_runs": len(firing),
        "first_firing_oldest_slot_age_s": round((created - min(firing)).total_seconds(), 3)
        if firing
        else None,
    }
    if restart:
        restarted = scheds.replace(slot)
        ready_s = wait_for(
            "the restarted scheduler's database session",
            lambda: bdb.has_session(restarted.pid) or restarted.poll() is not None,
            timeout=timeout,
            every=0.05,
        )
        if restarted.poll() is not None:
            raise RuntimeError(f"the restarted scheduler exited with {restarted.returncode}")
        figures["restarted_standby_ready_s"] = round(ready_s, 2)
    return figures


def _figures(
    ids: list[str],
    options: FailoverOptions,
    rounds: list[dict[str, Any]],
    rows: Rows,
    last_slot: datetime,
    step_errors: int,
    began: float,
) -> dict[str, Any]:
    first_slot: dict[str, datetime] = {}
    for dag_id, end, _ in rows:
        first_slot[dag_id] = min(first_slot.get(dag_id, end), end)
    start = max(first_slot.values())  # from here on every DAG must have every slot
    audit = slot_audit(
        [(d, e) for d, e, _ in rows], ids, seconds_from(start, last_slot + timedelta(seconds=1))
    )
    by_epoch: dict[int, int] = {}
    for _, _, epoch in rows:
        by_epoch[epoch] = by_epoch.get(epoch, 0) + 1
    takeover = [r["first_run_after_s"] for r in rounds]
    return {
        "settings": {
            "schedulers": options.schedulers,
            "dags": options.dags,
            "schedule": "every 1 s (interval, catchup on)",
            "repeats": options.repeats,
            "scheduler_lease_s": options.lease_s,
            "standby_poll_s": 0.5,
            "worker_slots": options.slots,
            "gap_between_kills_s": options.gap_s,
        },
        "load_1m_end": round(os.getloadavg()[0], 2),
        "rounds": rounds,
        "takeover_s": {
            "per_kill": takeover,
            "p50": round(statistics.median(takeover), 3) if takeover else None,
            "max": round(max(takeover), 3) if takeover else None,
            "lease_taken_max": max((r["lease_taken_after_s"] or 0 for r in rounds), default=None),
        },
        "slots": {
            **audit,
            "checked_from": start.isoformat(),
            "checked_until": last_slot.isoformat(),
            "runs_by_epoch": {str(k): v for k, v in sorted(by_epoch.items())},
        },
        "scheduler_step_errors": step_errors,
        "wall_s": round(time.monotonic() - began, 1),
        "target": {"takeover_s_below": 5, "missed": 0, "duplicated": 0},
        "meets_target": {
            "takeover": bool(takeover) and max(takeover) < 5,
            "every_slot_once": audit["missed"] == 0 and audit["duplicated"] == 0,
        },
    }
