"""Schedule-to-start latency: many DAGs on a 1-second interval, one scheduler, real workers.

The measurement is `treadle.bench.schedules` (also `treadle bench --only schedules`); see its
docstring for the method. This script runs it on a fresh PostgreSQL database (or a SQLite file
with `--database sqlite`: one `treadle standalone`), with the settings below, and prints one
JSON object, with the state of the checkout measured.
"""

from __future__ import annotations

import argparse
import tempfile
from contextlib import ExitStack
from pathlib import Path

from _common import code_drift, code_state, emit, fresh_database, machine

from treadle.bench.schedules import SchedulesOptions, measure_schedules


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dags", type=int, default=100, help="DAGs, each on a 1-second interval")
    parser.add_argument("--seconds", type=int, default=60, help="length of the measured window")
    parser.add_argument("--skip", type=float, default=2.0, help="seconds after the unpause left out")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=64, help="slots per worker")
    parser.add_argument("--per-file", type=int, default=25, help="DAGs per generated file")
    parser.add_argument(
        "--probe", action="store_true", help="time the scheduler loop's phases (treadle/bench/probe.py)"
    )
    parser.add_argument("--keep-logs", type=Path, help="copy the treadle logs into this folder")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for start-up / drain")
    parser.add_argument("--database", default="postgresql", choices=["postgresql", "sqlite"])
    args = parser.parse_args()

    options = SchedulesOptions(
        dags=args.dags,
        seconds=args.seconds,
        skip_s=args.skip,
        workers=args.workers,
        slots=args.concurrency,
        per_file=args.per_file,
        probe=args.probe,
        keep_logs=args.keep_logs,
        timeout_s=args.timeout,
    )
    code_at_start = code_state()
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="treadle-bench-")))
        url = fresh_database(stack, root, args.database, "bench_sl")
        figures = measure_schedules(root, url, options)
    emit(
        {
            "benchmark": "schedule_latency",
            "backend": args.database,
            "code": code_drift(code_at_start),
            "machine": machine(),
            **figures,
        }
    )


if __name__ == "__main__":
    main()
