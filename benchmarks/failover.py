"""Scheduler failover: SIGKILL the leader and time the standby's takeover (PostgreSQL).

`--schedulers` `treadle scheduler` processes, one worker, and `--dags` DAGs of one no-op task
on a 1-second interval with catchup on. Once the first leader has fired for a while, each of
`--repeats` rounds:

1. reads the `scheduler` row of `leases` (holder `host:pid:rand`, epoch) and matches the pid
   to one of the scheduler processes started here;
2. takes the database's `clock_timestamp()` and at once SIGKILLs that process's group, then
   takes the clock again (the kill lies between the two; the first is used);
3. waits for the first run with `dag_runs.leader_epoch` greater than the killed leader's
   epoch. Takeover = that run's `created_at` - the kill (database clock; target < 5 s).
   Also reported: when the new epoch's lease was acquired (`leases.acquired_at`);
4. restarts the killed scheduler as a new standby, waits until it has a database session, then
   lets `--gap` seconds pass before the next round.

At the end every DAG must have exactly one run per whole second from its first slot to the
last slot checked (catchup on: the new leader creates the slots missed while no one led);
missed and duplicated slots are counted. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    Processes,
    cli,
    code_drift,
    code_state,
    count_in_logs,
    db_clock,
    emit,
    holder_pid,
    machine,
    pg_connected,
    pg_database,
    print_log_tails,
    scheduler_lease,
    slot_audit,
    treadle_env,
    wait_for,
    write_scheduled_dags,
)

PREFIX = "bench_fo"


class Schedulers:
    """The scheduler processes, by slot; a killed one is replaced by a new process in its slot."""

    def __init__(self, procs: Processes, env: dict[str, str], root: Path, count: int) -> None:
        self.procs, self.env, self.root = procs, env, root
        self.current: list[subprocess.Popen[bytes]] = []
        self.current_logs: list[Path] = []
        #: Every scheduler log, killed processes' included.
        self.logs: list[Path] = []
        for slot in range(count):
            self.current.append(self._start(slot))
            self.current_logs.append(self.logs[-1])

    def _start(self, slot: int) -> subprocess.Popen[bytes]:
        log = self.root / f"scheduler{slot}_{len(self.logs)}.log"
        self.logs.append(log)
        return self.procs.start(["scheduler"], self.env, log)

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


def first_run_of_epoch_after(conn: psycopg.Connection[Any], epoch: int) -> tuple[datetime, int] | None:
    """(earliest created_at, epoch) of runs created under a leader epoch above `epoch`."""
    row = conn.execute(
        "SELECT created_at, leader_epoch FROM dag_runs WHERE leader_epoch > %s "
        "ORDER BY created_at, leader_epoch LIMIT 1",
        (epoch,),
    ).fetchone()
    return (row[0], int(row[1])) if row else None


def kill_round(conn: psycopg.Connection[Any], scheds: Schedulers, timeout: float) -> dict[str, Any]:
    """Kill the leader, time the takeover, restart the killed process; returns the round's figures."""
    holder, epoch, _ = scheduler_lease(conn)
    pid = holder_pid(holder)
    slot = scheds.slot_of(pid)
    if slot is None:
        raise RuntimeError(f"the lease holder {holder!r} is none of the schedulers started here")
    victim = scheds.current[slot]
    before = db_clock(conn)
    os.killpg(victim.pid, signal.SIGKILL)
    after = db_clock(conn)
    victim.wait(timeout=10)
    deadline = time.monotonic() + timeout
    while (found := first_run_of_epoch_after(conn, epoch)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no run under a new leader {timeout:.0f} s after killing epoch {epoch}")
        time.sleep(0.02)
    created, new_epoch = found
    row = conn.execute(
        "SELECT holder, acquired_at FROM leases WHERE name = 'scheduler' AND epoch >= %s", (new_epoch,)
    ).fetchone()
    new_holder, acquired = (row[0], row[1]) if row else (None, None)
    catchup = conn.execute(
        "SELECT count(*), min(data_interval_end) FROM dag_runs WHERE leader_epoch = %s AND created_at = %s",
        (new_epoch, created),
    ).fetchone()
    assert catchup is not None
    restarted = scheds.replace(slot)
    ready_s = wait_for(
        "the restarted scheduler's database session",
        lambda: pg_connected(conn, restarted.pid) or restarted.poll() is not None,
        timeout=timeout,
        every=0.05,
    )
    if restarted.poll() is not None:
        raise RuntimeError(f"the restarted scheduler exited with {restarted.returncode}")
    return {
        "killed_epoch": epoch,
        "killed_pid": pid,
        "new_epoch": new_epoch,
        "new_leader_pid": holder_pid(new_holder),
        "kill_clock_bracket_ms": round((after - before).total_seconds() * 1000, 2),
        "lease_taken_after_s": round((acquired - before).total_seconds(), 3) if acquired else None,
        "first_run_after_s": round((created - before).total_seconds(), 3),
        "first_firing_runs": int(catchup[0]),
        "first_firing_oldest_slot_age_s": round((created - catchup[1]).total_seconds(), 3),
        "restarted_standby_ready_s": round(ready_s, 2),
    }


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--schedulers", type=int, default=2, help="scheduler processes (>= 2)")
    parser.add_argument("--dags", type=int, default=20, help="DAGs on a 1-second interval, catchup on")
    parser.add_argument("--repeats", type=int, default=5, help="leader kills")
    parser.add_argument("--gap", type=float, default=4.0, help="seconds between a takeover and the next kill")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds of firing before the first kill")
    parser.add_argument("--concurrency", type=int, default=16, help="slots of the one worker")
    parser.add_argument("--lease", type=float, default=3.0, help="TREADLE_SCHEDULER_LEASE_SECONDS")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for any one step")
    args = parser.parse_args()
    if args.schedulers < 2:
        parser.error("--schedulers must be at least 2 (one leader, one standby)")

    procs = Processes()
    code_at_start = code_state()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_fo") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        ids = write_scheduled_dags(
            folder, prefix=PREFIX, count=args.dags, schedule="timedelta(seconds=1)", catchup=True
        )
        env = treadle_env(
            database_url=url,
            dags_folder=folder,
            home=root / "home",
            TREADLE_SCHEDULER_LEASE_SECONDS=str(args.lease),
        )
        worker_log = root / "worker.log"
        scheds: Schedulers | None = None
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env, timeout=args.timeout)
            worker = procs.start(["worker", "--concurrency", str(args.concurrency)], env, worker_log)
            scheds = Schedulers(procs, env, root, args.schedulers)
            with psycopg.connect(url, autocommit=True) as conn:
                wait_for(
                    "a first scheduled run",
                    lambda: conn.execute("SELECT 1 FROM dag_runs LIMIT 1").fetchone() is not None,
                    timeout=args.timeout,
                )
                for proc in scheds.current:
                    wait_for(
                        "every scheduler's session", lambda p=proc: pg_connected(conn, p.pid), timeout=60
                    )
                time.sleep(args.warmup)
                rounds = []
                for _ in range(args.repeats):
                    scheds.check_alive(worker, worker_log)
                    rounds.append(kill_round(conn, scheds, args.timeout))
                    time.sleep(args.gap)
                # Every slot up to two seconds ago must have its run by now (catch-up included).
                last_slot = (db_clock(conn) - timedelta(seconds=2)).replace(microsecond=0)
                rows = conn.execute(
                    "SELECT dag_id, data_interval_end, leader_epoch FROM dag_runs "
                    "WHERE run_type = 'scheduled'"
                ).fetchall()
            step_errors = count_in_logs(scheds.logs, '"scheduler.step_error"')
        except BaseException:
            print_log_tails([worker_log, *(scheds.logs if scheds else [])])
            raise
        finally:
            procs.stop_all()

    first_slot = {}
    for dag_id, end, _ in rows:
        first_slot[dag_id] = min(first_slot.get(dag_id, end), end)
    start = max(first_slot.values())  # from here on every DAG must have every slot
    expected = []
    t = start
    while t <= last_slot:
        expected.append(t)
        t += timedelta(seconds=1)
    audit = slot_audit([(d, e) for d, e, _ in rows], ids, expected)
    by_epoch: dict[int, int] = {}
    for _, _, epoch in rows:
        by_epoch[epoch] = by_epoch.get(epoch, 0) + 1
    takeover = [r["first_run_after_s"] for r in rounds]
    emit(
        {
            "benchmark": "failover",
            "backend": "postgresql",
            "settings": {
                "schedulers": args.schedulers,
                "dags": args.dags,
                "schedule": "every 1 s (interval, catchup on)",
                "repeats": args.repeats,
                "scheduler_lease_s": args.lease,
                "standby_poll_s": 0.5,
                "worker_concurrency": args.concurrency,
                "gap_between_kills_s": args.gap,
            },
            "code": code_drift(code_at_start),
            "machine": {**machine(), "loadavg_1m_end": round(os.getloadavg()[0], 2)},
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
    )


if __name__ == "__main__":
    main()
