"""Start real treadle processes (worker, scheduler, standalone) for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def treadle_env(*, database_url: str, dags_folder: Path, home: Path, **extra: str) -> dict[str, str]:
    """Environment for a treadle process under test."""
    env = dict(os.environ)
    env.update(
        {
            "TREADLE_DATABASE_URL": database_url,
            "TREADLE_DAGS_FOLDER": str(dags_folder),
            "TREADLE_HOME": str(home),
            "TREADLE_SCHEDULER_TICK_SECONDS": "0.2",
            # Teardown sends SIGTERM: do not let a sleeping test task hold it for the default 30 s.
            "TREADLE_SHUTDOWN_GRACE_SECONDS": "1",
            **extra,
        }
    )
    return env


def start(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `treadle ARGS...` with output to `log_path`."""
    log = log_path.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "treadle.cli", *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # A test run started in the background of a non-interactive shell ignores SIGINT, and
        # children inherit that: give them the default, as a terminal's Ctrl-C would find it.
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(proc: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal a process (group) and wait for it; SIGKILL if it does not end in time."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextmanager
def running(args: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run a treadle process for the duration of a block."""
    proc = start(args, env, log_path)
    try:
        yield proc
    finally:
        stop(proc)


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a short CLI command and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "treadle.cli", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
