"""Schedule burst: many DAGs due in the same second, one scheduler, no workers.

The measurement is `treadle.bench.burst` (also `treadle bench --only burst`); see its docstring
for the method. This script runs it on a fresh PostgreSQL database (or a SQLite file with
`--database sqlite`) and prints one JSON object, with the state of the checkout measured.
`--probe` times the scheduler loop's phases; `--profile` also runs each `fire()` under cProfile
inside the scheduler (profiling slows firing down: those delay figures are inflated).
"""

from __future__ import annotations

import argparse
import tempfile
from contextlib import ExitStack
from pathlib import Path

from _common import code_drift, code_state, emit, fresh_database, machine

from treadle.bench.burst import BurstOptions, measure_burst


def main() -> None:
    """Run the benchmark and print its JSON figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dags", type=int, default=10_000, help="DAGs, all due in the same second")
    parser.add_argument(
        "--kind", choices=["cron", "interval"], default="cron", help="cron * * * * * or an interval"
    )
    parser.add_argument("--every", type=int, default=60, help="seconds of the interval (--kind interval)")
    parser.add_argument("--per-file", type=int, default=1000, help="DAGs per generated file")
    parser.add_argument("--probe", action="store_true", help="time the scheduler loop's phases")
    parser.add_argument("--profile", action="store_true", help="cProfile fire() in the scheduler")
    parser.add_argument("--keep-logs", type=Path, help="copy the scheduler log (and probe) here")
    parser.add_argument("--timeout", type=float, default=170, help="seconds for sync and for the firing")
    parser.add_argument("--database", default="postgresql", choices=["postgresql", "sqlite"])
    args = parser.parse_args()

    options = BurstOptions(
        dags=args.dags,
        every_s=args.every if args.kind == "interval" else None,
        per_file=args.per_file,
        probe=args.probe,
        profile=args.profile,
        keep_logs=args.keep_logs,
        timeout_s=args.timeout,
    )
    code_at_start = code_state()
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="treadle-bench-")))
        url = fresh_database(stack, root, args.database, "bench_burst")
        figures = measure_burst(root, url, options)
    emit(
        {
            "benchmark": "schedule_burst",
            "backend": args.database,
            "code": code_drift(code_at_start),
            "machine": machine(),
            **figures,
        }
    )


if __name__ == "__main__":
    main()
