"""Scheduler failover: SIGKILL the leader and time the standby's takeover.

The measurement is `treadle.bench.failover` (also `treadle bench --only failover`); see its
docstring for the method. This script runs it on a fresh PostgreSQL database (or a SQLite file
with `--database sqlite`) and prints one JSON object, with the state of the checkout measured.
"""

from __future__ import annotations

import argparse
import tempfile
from contextlib import ExitStack
from pathlib import Path

from _common import code_drift, code_state, emit, fresh_database, machine

from treadle.bench.failover import FailoverOptions, measure_failover


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
    parser.add_argument("--database", default="postgresql", choices=["postgresql", "sqlite"])
    args = parser.parse_args()
    if args.schedulers < 2:
        parser.error("--schedulers must be at least 2 (one leader, one standby)")

    options = FailoverOptions(
        schedulers=args.schedulers,
        dags=args.dags,
        repeats=args.repeats,
        gap_s=args.gap,
        warmup_s=args.warmup,
        slots=args.concurrency,
        lease_s=args.lease,
        timeout_s=args.timeout,
    )
    code_at_start = code_state()
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="treadle-bench-")))
        url = fresh_database(stack, root, args.database, "bench_fo")
        figures = measure_failover(root, url, options)
    emit(
        {
            "benchmark": "failover",
            "backend": args.database,
            "code": code_drift(code_at_start),
            "machine": machine(),
            **figures,
        }
    )


if __name__ == "__main__":
    main()
