"""Shared plumbing for the benchmark scripts.

The generic part (databases, processes, CPU meters, figures) and the scheduler benchmarks'
pieces (scheduled DAGs, slot bookkeeping, the loop probe) live in `treadle.bench`, which
`treadle bench` uses too; what only these scripts need is below: the state of the checkout
measured, and psycopg helpers of the PostgreSQL-only scripts.
"""

from __future__ import annotations

import subprocess
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from treadle.bench.harness import (
    PG_ADMIN_URL,
    CpuMeter,
    Processes,
    check_alive,
    cli,
    count_in_logs,
    cpu_seconds,
    dist_ms,
    emit,
    log_mentions,
    machine,
    percentile,
    pg_backend_pids,
    pg_database,
    pg_url,
    print_log_tails,
    stop_groups,
    summary_ms,
    treadle_env,
    wait_for,
)
from treadle.bench.probe import probe_summary, start_probed_scheduler
from treadle.bench.scheduling import set_paused_many, slot_audit, whole_second_after

__all__ = [
    "PG_ADMIN_URL",
    "CpuMeter",
    "Processes",
    "check_alive",
    "cli",
    "code_drift",
    "code_state",
    "count_in_logs",
    "cpu_seconds",
    "db_clock",
    "dist_ms",
    "emit",
    "fresh_database",
    "log_mentions",
    "machine",
    "percentile",
    "pg_backend_pids",
    "pg_database",
    "pg_url",
    "print_log_tails",
    "probe_summary",
    "set_paused_many",
    "slot_audit",
    "start_probed_scheduler",
    "stop_groups",
    "summary_ms",
    "treadle_env",
    "wait_db_time",
    "wait_for",
    "whole_second_after",
]


def fresh_database(stack: ExitStack, root: Path, backend: str, prefix: str) -> str:
    """URL of a fresh database for one script: a new PostgreSQL database named `{prefix}_*`
    (dropped when `stack` closes) or, for backend "sqlite", a new file under `root`."""
    if backend == "sqlite":
        return f"sqlite:///{root / 'bench.db'}"
    return stack.enter_context(pg_database(prefix))


def code_state() -> dict[str, Any]:
    """The commit measured and a fingerprint of uncommitted changes under src/ (figures move with both)."""
    import hashlib

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout

    diff = git("diff", "HEAD", "--", "src")
    changed = [line for line in git("status", "--porcelain", "--", "src").splitlines() if line.strip()]
    import treadle

    imported = Path(treadle.__file__).resolve().parent
    return {
        "treadle_imported_from": str(imported),
        # When False (PYTHONPATH points elsewhere) the fields below describe the checkout, not
        # the code measured.
        "imported_from_checkout": imported == root / "src" / "treadle",
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "src_uncommitted_files": len(changed),
        "src_diff_sha1": hashlib.sha1(diff.encode(), usedforsecurity=False).hexdigest()[:12]
        if diff
        else None,
    }


def code_drift(at_start: dict[str, Any]) -> dict[str, Any]:
    """code_state() at the start, and whether the checkout changed while the benchmark ran."""
    now = code_state()
    return {**at_start, "changed_during_run": now != at_start, **({"at_end": now} if now != at_start else {})}


# --- psycopg helpers (PostgreSQL-only scripts) ------------------------------------------------


def db_clock(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock_timestamp() (one round trip)."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def wait_db_time(conn: psycopg.Connection[Any], until: datetime, procs: Processes, logs: list[Path]) -> None:
    """Sleep until the database clock passes `until`, checking the processes now and then."""
    while True:
        left = (until - db_clock(conn)).total_seconds()
        if left <= 0:
            return
        check_alive(procs, logs)
        time.sleep(min(left, 1.0))
