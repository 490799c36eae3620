"""What per-attempt logs and command tasks cost in a task process, measured in this process.

- `log_redirect`: one Python attempt's extra work: open its log file (folders made), point fds
  1 and 2 at the copying pipe, restore them and drain (the task itself prints one line).
- `manifest`: writing the run manifest the first time on a host, and the check that skips it
  for the run's later attempts.
- `command`: a command task running `/bin/true` (allow-list check, environment, fresh output
  folder, two copying threads, exit classification) against a bare `subprocess.run` of it,
  the two interleaved.

Prints one JSON object; targets: the log redirection and the manifest check under 1 ms per
attempt (median), a command's overhead over the bare spawn under 5 ms.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import emit, machine, summary_ms

from treadle.domain.commands import CommandSpec
from treadle.domain.exit_codes import ExitContract
from treadle.worker.attempt_log import AttemptLog, redirected_output
from treadle.worker.command import run_command, write_manifest

LOG_TARGET_MS = 1.0
COMMAND_OVERHEAD_TARGET_MS = 5.0


def timed(n: int, step: Callable[[int], object]) -> list[float]:
    """Durations of `n` calls of `step(i)`, in seconds."""
    out = []
    for i in range(n):
        began = time.perf_counter()
        step(i)
        out.append(time.perf_counter() - began)
    return out


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attempts", type=int, default=500, help="attempts measured per figure")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="treadle-bench-files-"))
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1)
    os.dup2(devnull, 1)  # what the tasks print is not this script's report

    def attempt(i: int) -> None:
        log = AttemptLog(root / "logs" / "d" / f"run{i}" / "t" / "1.log", max_bytes=200 * 1024 * 1024)
        with redirected_output(log):
            print("one line from the task", flush=True)
        log.close()

    try:
        redirect = timed(args.attempts, attempt)
        first_manifest = timed(
            args.attempts, lambda i: write_manifest(root / "runs", f"run{i}", {"run_id": i})
        )
        again = timed(args.attempts, lambda i: write_manifest(root / "runs", f"run{i}", {"run_id": i}))
        spec = CommandSpec(argv=("/bin/true",), manifest_arg=False)
        log = AttemptLog(root / "command.log", max_bytes=200 * 1024 * 1024)

        def command(i: int) -> None:
            msg = {
                "run_id": "run0",
                "dag_id": "d",
                "task_id": "t",
                "attempt": i + 1,
                "runs_dir": str(root / "runs"),
            }
            reply = run_command(
                spec, ExitContract(), msg, argv=None, manifest_path="m", log=log, max_result_bytes=65536
            )
            assert reply["ok"], reply

        # Interleaved, so that both see the same load on a busy machine.
        bare: list[float] = []
        commands: list[float] = []
        for i in range(args.attempts):
            bare += timed(1, lambda _i: subprocess.run(["/bin/true"], check=False))
            commands += timed(1, lambda _i, i=i: command(i))
    finally:
        os.dup2(saved, 1)
    overhead_ms = (sorted(commands)[len(commands) // 2] - sorted(bare)[len(bare) // 2]) * 1000
    redirect_ms = summary_ms(redirect)
    emit(
        {
            "benchmark": "attempt_files",
            "attempts": args.attempts,
            "log_redirect": redirect_ms,
            "manifest_first_write": summary_ms(first_manifest),
            "manifest_already_there": summary_ms(again),
            "bare_spawn_true": summary_ms(bare),
            "command_task_true": summary_ms(commands),
            "command_overhead_median_ms": round(overhead_ms, 2),
            "targets": {
                "log_redirect_median_ms": LOG_TARGET_MS,
                "command_overhead_ms": COMMAND_OVERHEAD_TARGET_MS,
            },
            "meets_target": redirect_ms["median_ms"] < LOG_TARGET_MS
            and overhead_ms < COMMAND_OVERHEAD_TARGET_MS,
            "python": sys.version.split()[0],
            **machine(),
        }
    )


if __name__ == "__main__":
    main()
