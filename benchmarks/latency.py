"""Ready-to-started latency on PostgreSQL with two worker processes.

For every task instance, the latency is its `started_at` (the claim statement's database time)
minus its `queued_at` (the database time at which it became ready), both written by the
database clock. Two shapes, each with fewer ready tasks at a time than free slots, so the
figure is the dispatch path (commit, NOTIFY, wake-up, claim), not a wait for a slot:

* waves: runs of `--wave` independent no-op tasks, triggered one after another (each once the
  previous has finished, plus a short pause); the roots become ready when the run is created.
* fan-out: runs of one root task followed by `--fanout` no-op tasks that become ready when the
  root completes (the completion transaction readies them and sends NOTIFY).

Prints one JSON object with p50 / p99 / max per shape and overall. With `--profile` it also
samples where the time goes, from the outside: NOTIFY delivery to a separate listener, and
the database time of each claim statement relative to the commit that readied its tasks.
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    Processes,
    check_alive,
    cli,
    dist_ms,
    emit,
    log_mentions,
    machine,
    pg_database,
    print_log_tails,
    treadle_env,
    wait_for,
)

from treadle.bench.db import BenchDb, ready_to_started
from treadle.engine.runs import trigger_run
from treadle.store.database import Database
from treadle.store.dialects import READY_CHANNEL

WAVE_DAG, FANOUT_DAG = "bench_lat_wave", "bench_lat_fanout"


def dag_source(wave: int, fanout: int) -> str:
    """Two DAGs: `wave` independent no-ops, and one root readying `fanout` no-ops."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        from treadle import dag, task


        @task
        def noop() -> None:
            return None


        @task
        def root() -> int:
            return 1


        @task
        def leaf(value: int) -> int:
            return value


        @dag(dag_id="{WAVE_DAG}")
        def {WAVE_DAG}() -> None:
            for _ in range({wave}):
                noop()


        @dag(dag_id="{FANOUT_DAG}")
        def {FANOUT_DAG}() -> None:
            value = root()
            for _ in range({fanout}):
                leaf(value)
        """
    )


_databases: dict[str, Database] = {}
#: Client-side duration of each trigger_run call (its transaction, with the commit).
trigger_wall_s: list[float] = []


def trigger(url: str, dag_id: str) -> str:
    """Trigger a run in-process (a CLI process per run would pace the waves by its start-up)."""
    db = _databases.setdefault(url, Database(url, application_name="treadle-bench"))
    began = time.perf_counter()
    run_id = trigger_run(db, dag_id, triggered_by="bench-latency").run_id
    trigger_wall_s.append(time.perf_counter() - began)
    return run_id


def run_state(conn: psycopg.Connection, run_id: str) -> str:
    """The run's state as the database holds it."""
    row = conn.execute("SELECT state FROM dag_runs WHERE run_id = %s", (run_id,)).fetchone()
    return str(row[0]) if row else "missing"


class NotifyClock:
    """A separate LISTEN connection noting when each ready NOTIFY arrives (database time)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.arrivals: list[datetime] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"LISTEN {READY_CHANNEL}")
            clock = psycopg.connect(self.url, autocommit=True)
            try:
                while not self.stop.is_set():
                    for _ in conn.notifies(timeout=0.2):
                        row = clock.execute("SELECT clock_timestamp()").fetchone()
                        assert row is not None
                        self.arrivals.append(row[0])
            finally:
                clock.close()


def drive(
    url: str, dag_id: str, runs: int, pause_s: float, timeout: float, procs: Processes, logs: list[Path]
) -> list[str]:
    """Trigger `runs` runs of one DAG, one after another; returns their ids."""
    ids = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(runs):
            run_id = trigger(url, dag_id)
            ids.append(run_id)
            deadline = time.monotonic() + timeout
            while run_state(conn, run_id) not in ("success", "failed"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run {run_id} did not finish in {timeout} s")
                check_alive(procs, logs)
                time.sleep(0.01)
            time.sleep(pause_s)
    return ids


def latencies(url: str, run_ids: list[str], *, with_upstream: bool | None) -> list[float]:
    """started_at - queued_at (seconds) of first attempts in the given runs (treadle.bench.db).

    with_upstream: True for tasks readied by an upstream completion, False for roots, None for all.
    """
    bdb = BenchDb(url)
    try:
        return ready_to_started(bdb, run_ids, with_upstream=with_upstream)
    finally:
        bdb.close()


def profile(url: str, run_ids: list[str], arrivals: list[datetime]) -> dict[str, Any]:
    """Split each run's latency: ready -> NOTIFY seen by our own listener -> claims.

    Per run, the ready time is the earliest `queued_at` among the tasks counted (the statement or
    transaction time that readied them, before the commit); the first NOTIFY our listener saw at
    or after it approximates commit plus delivery (the listener stamps it with one more round
    trip, so it reads late by about that much); then the first and the last claim statement.
    """
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT run_id, queued_at, started_at, upstream_total FROM task_instances "
            "WHERE run_id = ANY(%s) AND attempt = 1",
            (run_ids,),
        ).fetchall()
    fanout = any(up > 0 for _, _, _, up in rows)
    by_run: dict[str, list[tuple[datetime, datetime]]] = {}
    for run_id, queued, started, upstream_total in rows:
        if (upstream_total > 0) == fanout:
            by_run.setdefault(run_id, []).append((queued, started))
    ordered = sorted(arrivals)
    to_notify, notify_to_first, first_to_last = [], [], []
    for pairs in by_run.values():
        ready = min(q for q, _ in pairs)
        starts = sorted(s for _, s in pairs)
        seen = next((a for a in ordered if a >= ready), None)
        if seen is not None and seen <= starts[-1] + timedelta(milliseconds=50):
            to_notify.append((seen - ready).total_seconds())
            notify_to_first.append((starts[0] - seen).total_seconds())
        first_to_last.append((starts[-1] - starts[0]).total_seconds())
    return {
        "ready_to_notify_seen": dist_ms(to_notify),
        "notify_seen_to_first_claim": dist_ms(notify_to_first),
        "first_to_last_claim_of_a_run": dist_ms(first_to_last),
    }


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=500, help="independent tasks, in waves")
    parser.add_argument("--wave", type=int, default=5, help="tasks per wave (keep below the slots)")
    parser.add_argument("--fanout", type=int, default=6, help="tasks readied by one upstream")
    parser.add_argument("--fanout-runs", type=int, default=50, help="fan-out runs")
    parser.add_argument("--concurrency", type=int, default=4, help="slots per worker (two workers)")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between runs")
    parser.add_argument("--profile", action="store_true", help="also split where the time goes")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for one run")
    args = parser.parse_args()

    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_lat") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "latency.py").write_text(dag_source(args.wave, args.fanout))
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / "worker0.log", root / "worker1.log", root / "scheduler.log"]
        listener = NotifyClock(url)
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env)
            for log in logs[:2]:
                procs.start(["worker", "--concurrency", str(args.concurrency)], env, log)
            procs.start(["scheduler"], env, logs[2])
            for log in logs[:2]:
                wait_for("the workers", lambda log=log: log_mentions(log, '"worker.started"'), timeout=60)
            if args.profile:
                listener.thread.start()
            drive(url, WAVE_DAG, 3, args.pause, args.timeout, procs, logs)  # warm-up, not counted
            waves = -(-args.tasks // args.wave)
            wave_ids = drive(url, WAVE_DAG, waves, args.pause, args.timeout, procs, logs)
            fan_ids = drive(url, FANOUT_DAG, args.fanout_runs, args.pause, args.timeout, procs, logs)
            listener.stop.set()
            waves_s = latencies(url, wave_ids, with_upstream=None)
            roots_s = latencies(url, fan_ids, with_upstream=False)
            leaves_s = latencies(url, fan_ids, with_upstream=True)
            extra = {}
            if args.profile:
                extra["profile"] = {
                    "waves": profile(url, wave_ids, listener.arrivals),
                    "fanout_leaves": profile(url, fan_ids, listener.arrivals),
                    "trigger_run_call_wall": dist_ms(trigger_wall_s),
                }
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            listener.stop.set()
            procs.stop_all()
            for db in _databases.values():
                db.dispose()
    overall = waves_s + roots_s + leaves_s
    figures = dist_ms(overall)
    emit(
        {
            "benchmark": "latency",
            "backend": "postgresql",
            "settings": {
                "workers": 2,
                "concurrency_per_worker": args.concurrency,
                "wave_size": args.wave,
                "wave_runs": len(wave_ids),
                "fanout": args.fanout,
                "fanout_runs": args.fanout_runs,
                "pause_between_runs_s": args.pause,
            },
            "machine": machine(),
            "ready_to_started": {
                "waves_triggered": dist_ms(waves_s),
                "fanout_roots_triggered": dist_ms(roots_s),
                "fanout_readied_by_upstream": dist_ms(leaves_s),
                "all": figures,
            },
            **extra,
            "target": {"p50_ms_below": 5, "p99_ms_below": 25},
            "meets_target": figures.get("p50_ms", 1e9) < 5 and figures.get("p99_ms", 1e9) < 25,
        }
    )


if __name__ == "__main__":
    main()
