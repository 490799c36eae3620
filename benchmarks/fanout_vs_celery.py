"""Fan-out 1 -> N -> 1 in treadle (PostgreSQL) versus Celery (Redis broker and result backend).

The same workflow in both: one task, `--width` parallel no-op tasks that each take its result,
and one join task that consumes all their results. treadle runs it as a DAG with two worker
processes of `--concurrency` slots; Celery as `chain(start, chord(group(noop x N), join))` with
two `celery worker` processes (prefork pool, `--concurrency` children each). Both sides get one
warm-up run, then `--reps` measured runs, one at a time; the systems run one after the other,
never at once.

The figure is end-to-end wall time from submitting (treadle: `trigger_run`, in-process; Celery:
`apply_async`) to having the final result (treadle: the run observed `success`, polled every
5 ms, and the join's result read back; Celery: `AsyncResult.get()`). Prints one JSON object
with the medians side by side. Needs `pip install -e '.[bench]'` (celery[redis]) and a Redis
server at `--redis` (default redis://127.0.0.1:6379/13): the script refuses a non-empty
database and empties it again at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    Processes,
    check_alive,
    cli,
    emit,
    log_mentions,
    machine,
    pg_database,
    print_log_tails,
    stop_groups,
    treadle_env,
    wait_for,
)

from treadle.bench.workloads import CELERY_APP, fanout_dag
from treadle.engine.runs import trigger_run
from treadle.store.database import Database

DAG_ID = "bench_fanout"


# -- treadle ----------------------------------------------------------------------------------
def treadle_dag(width: int) -> str:
    """start -> `width` no-ops (each takes start's result) -> join(all their results)."""
    return fanout_dag(DAG_ID, width)


def treadle_once(
    db: Database, conn: psycopg.Connection, timeout: float, procs: Processes, logs: list[Path]
) -> tuple[float, int]:
    """One run: (wall seconds from trigger to observed success, the join's result)."""
    began = time.perf_counter()
    run_id = trigger_run(db, DAG_ID, triggered_by="bench-fanout").run_id
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute("SELECT state FROM dag_runs WHERE run_id = %s", (run_id,)).fetchone()
        if row and row[0] in ("success", "failed"):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"treadle run {run_id} did not finish in {timeout} s")
        check_alive(procs, logs)
        time.sleep(0.005)
    wall = time.perf_counter() - began
    if row[0] != "success":
        raise RuntimeError(f"treadle run {run_id} ended {row[0]}")
    value = conn.execute(
        "SELECT value FROM task_results WHERE run_id = %s AND task_id = 'join'", (run_id,)
    ).fetchone()
    assert value is not None
    return wall, int(value[0])


def bench_treadle(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up plus `args.reps` measured runs in treadle; returns the figures."""
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="treadle-bench-") as tmp, pg_database("bench_fan") as url:
        root = Path(tmp)
        folder = root / "dags"
        folder.mkdir()
        (folder / "fanout.py").write_text(treadle_dag(args.width))
        env = treadle_env(database_url=url, dags_folder=folder, home=root / "home")
        logs = [root / "worker0.log", root / "worker1.log", root / "scheduler.log"]
        db = Database(url, application_name="treadle-bench")
        try:
            cli(["db", "upgrade"], env)
            cli(["dags", "sync"], env)
            for log in logs[:2]:
                procs.start(["worker", "--concurrency", str(args.concurrency)], env, log)
            procs.start(["scheduler"], env, logs[2])
            for log in logs[:2]:
                wait_for("the workers", lambda log=log: log_mentions(log, '"worker.started"'), timeout=60)
            walls, values = [], []
            with psycopg.connect(url, autocommit=True) as conn:
                treadle_once(db, conn, args.timeout, procs, logs)  # warm-up
                for _ in range(args.reps):
                    wall, value = treadle_once(db, conn, args.timeout, procs, logs)
                    walls.append(wall)
                    values.append(value)
                spans = conn.execute(
                    "SELECT extract(epoch FROM ended_at - created_at) FROM dag_runs "
                    "ORDER BY created_at OFFSET 1"
                ).fetchall()
        except BaseException:
            print_log_tails(logs)
            raise
        finally:
            procs.stop_all()
            db.dispose()
    return {
        "median_s": round(statistics.median(walls), 3),
        "runs_s": [round(w, 3) for w in walls],
        "run_span_db_median_s": round(statistics.median(float(s[0]) for s in spans), 3),
        "join_results": sorted(set(values)),
    }


# -- Celery -----------------------------------------------------------------------------------


class CeleryWorkers:
    """Two `celery worker` processes, each in its own session; stopped with their children."""

    def __init__(self, root: Path, env: dict[str, str], concurrency: int) -> None:
        self.root, self.env, self.concurrency = root, env, concurrency
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [root / f"celery{i}.log" for i in range(2)]

    def start(self) -> None:
        """Start both workers and wait until each says it is ready."""
        for i, log in enumerate(self.logs):
            argv = [sys.executable, "-m", "celery", "-A", "bench_celery_app", "worker"]
            argv += [
                "--pool",
                "prefork",
                "--concurrency",
                str(self.concurrency),
                "--hostname",
                f"bench{i}@%h",
            ]
            argv += ["--loglevel", "INFO", "--logfile", str(log)]
            argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
            with (self.root / f"celery{i}.out").open("ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=self.root,
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        for log in self.logs:
            wait_for("a Celery worker to be ready", lambda log=log: log_mentions(log, " ready."), timeout=60)

    def check(self) -> None:
        """Raise if a worker ended early."""
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a Celery worker exited with {proc.returncode}")

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL what is left, whole process groups."""
        stop_groups(self.procs, grace_s=15)

    def tails(self) -> None:
        """Copy the end of each Celery log to stderr."""
        print_log_tails(self.logs + [self.root / f"celery{i}.out" for i in range(2)])


def bench_celery(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up plus `args.reps` measured chords in Celery; returns the figures."""
    import redis
    from celery import chain, chord, group

    client = redis.Redis.from_url(args.redis)
    if client.dbsize() != 0:
        raise SystemExit(f"{args.redis} is not empty; pick an unused database with --redis")
    with tempfile.TemporaryDirectory(prefix="treadle-bench-celery-") as tmp:
        root = Path(tmp)
        (root / "bench_celery_app.py").write_text(CELERY_APP)
        env = dict(os.environ, BENCH_REDIS=args.redis, BENCH_QUEUE=f"bench_fanout_{os.getpid()}")
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        os.environ.update(BENCH_REDIS=env["BENCH_REDIS"], BENCH_QUEUE=env["BENCH_QUEUE"])
        sys.path.insert(0, str(root))
        import bench_celery_app as tasks

        workers = CeleryWorkers(root, env, args.concurrency)
        walls, values = [], []
        try:
            workers.start()

            def once() -> tuple[float, int]:
                began = time.perf_counter()
                flow = chain(
                    tasks.start.s(), chord(group(tasks.noop.s() for _ in range(args.width)), tasks.join.s())
                )
                value = flow.apply_async().get(timeout=args.timeout, interval=0.005)
                return time.perf_counter() - began, int(value)

            workers.check()
            once()  # warm-up
            for _ in range(args.reps):
                wall, value = once()
                walls.append(wall)
                values.append(value)
            workers.check()
        except BaseException:
            workers.tails()
            raise
        finally:
            workers.stop()
            tasks.app.close()
            client.flushdb()
            client.close()
    return {
        "median_s": round(statistics.median(walls), 3),
        "runs_s": [round(w, 3) for w in walls],
        "join_results": sorted(set(values)),
    }


def main() -> None:
    """Run both sides and print their figures in one JSON object."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--width", type=int, default=500, help="parallel no-op tasks")
    parser.add_argument("--concurrency", type=int, default=8, help="slots / prefork children per worker")
    parser.add_argument("--reps", type=int, default=5, help="measured runs per system")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13", help="an empty Redis database")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for one run")
    parser.add_argument("--only", choices=["treadle", "celery"], help="measure one side only")
    args = parser.parse_args()

    result: dict[str, Any] = {
        "benchmark": "fanout_vs_celery",
        "settings": {
            "shape": f"1 -> {args.width} -> 1",
            "workers": 2,
            "concurrency_per_worker": args.concurrency,
            "reps": args.reps,
            "treadle": "PostgreSQL, child-process slots, DAG run triggered in-process",
            "celery": "Redis broker + result backend, prefork pool, chain(start, chord(group, join))",
        },
        "machine": machine(),
    }
    if args.only in (None, "treadle"):
        result["treadle"] = bench_treadle(args)
    if args.only in (None, "celery"):
        import celery

        result["celery"] = bench_celery(args) | {"version": celery.__version__}
    if "treadle" in result and "celery" in result:
        result["median_wall_s"] = {
            "treadle": result["treadle"]["median_s"],
            "celery": result["celery"]["median_s"],
        }
        result["treadle_over_celery"] = round(result["treadle"]["median_s"] / result["celery"]["median_s"], 2)
    emit(result)


if __name__ == "__main__":
    main()
