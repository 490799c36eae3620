"""What admission control costs a trigger: latency with the queued-instance limits off and on.

In process (no API server): seeds `--queued` queued task instances (one-task runs inserted in
batches, as the engine builds them) on one queue and one DAG, then triggers `--triggers` runs
alternating between the limits off and on, so a growing queue favours neither. "On" sets both
limits just above the seeded depth: the worst case, since each trigger then counts every queued
instance of its queue and of its DAG (the counts stop at the limit, so a deeper queue costs no
more; the cost follows the limit, not the backlog).

Prints one JSON object: p50 / p99 per mode and the p50 difference. Target: the check adds at
most 10 ms at the median with limits of 10,000 (the default `--queued`).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

from _common import dist_ms, emit, fresh_database, machine

from treadle import dag, task
from treadle.domain.admission import AdmissionLimits
from treadle.domain.dag_version import DagVersion
from treadle.domain.states import RunType
from treadle.engine.dags import sync_dags
from treadle.engine.runs import new_run, trigger_run
from treadle.store import migrate
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

TARGET_EXTRA_P50_MS = 10.0


@task
def noop() -> None:
    return None


@dag(dag_id="bench_admission")
def one_task() -> None:
    noop()


def seed(db: Database, queued: int) -> None:
    """`queued` one-task runs whose only instance is queued."""
    versions = sync_dags(db, structures=[one_task.structure()], scanned_files=[], errors={}).versions
    version = DagVersion.of(versions["bench_admission"], one_task.structure())
    now = db.query(db_now)
    done = 0
    while done < queued:
        batch = min(2000, queued - done)
        made = [
            new_run(
                version,
                run_type=RunType.MANUAL,
                logical_date=now - timedelta(seconds=done + i + 1),
                data_interval=(now, now),
                conf={},
                params={},
                triggered_by="bench",
                now=now,
                default_queue_timeout_s=86400,
            )
            for i in range(batch)
        ]
        with db.begin() as conn:
            run_store.insert_runs(conn, [r for r, _ in made])
            ti_store.insert_task_instances(conn, [row for _, rows in made for row in rows])
        done += batch
    if db.dialect == "postgresql":
        with db.begin() as conn:
            conn.exec_driver_sql("ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--triggers", type=int, default=300)
    args = parser.parse_args()
    high = args.queued + args.triggers * 3 + 10
    modes = {"off": AdmissionLimits(), "on": AdmissionLimits(per_queue=high, per_dag=high)}
    times: dict[str, list[float]] = {"off": [], "on": []}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as root:
        db = Database(fresh_database(stack, Path(root), args.backend, "bench_admission"))
        stack.callback(db.dispose)
        migrate.upgrade(db)
        seed(db, args.queued)
        for n in range(args.triggers * 2):
            mode = "on" if n % 2 else "off"
            start = time.perf_counter()
            trigger_run(db, "bench_admission", triggered_by="bench", admission=modes[mode])
            times[mode].append(time.perf_counter() - start)
    figures = {mode: dist_ms(values) for mode, values in times.items()}
    extra = figures["on"]["p50_ms"] - figures["off"]["p50_ms"]
    emit(
        {
            "benchmark": "admission",
            "backend": args.backend,
            "queued": args.queued,
            "triggers_per_mode": args.triggers,
            "trigger": figures,
            "extra_p50_ms": round(extra, 2),
            "target_extra_p50_ms": TARGET_EXTRA_P50_MS,
            "meets_target": extra <= TARGET_EXTRA_P50_MS,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
