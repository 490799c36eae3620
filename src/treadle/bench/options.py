"""What `treadle bench` measures and how (one frozen object, built by the CLI)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    """What `treadle bench` measures and how."""

    #: A PostgreSQL URL (a fresh database is created on that server) or "sqlite".
    database: str = "sqlite"
    slots: int = 2
    workers: int = 1
    reps: int = 3
    #: Workloads by short or full name; empty: the default set (or every one with `everything`).
    only: tuple[str, ...] = ()
    #: Every workload but the 100,000-task run.
    everything: bool = False
    #: Also the `huge_tasks` run (after the `big` one, which it is compared with).
    huge: bool = False
    vs_celery: bool = False
    redis: str = "redis://127.0.0.1:6379/13"
    timeout_s: float = 300.0
    chain: int = 100
    width: int = 500
    independent: int = 2000
    big: int = 10_000
    huge_tasks: int = 100_000
    #: DAGs on a 1-second schedule, and how long their window lasts.
    schedules: int = 100
    duration_s: int = 60
    #: Leader kills in the failover workload.
    failovers: int = 3
    #: DAGs due at once in the burst, and their interval (None: cron `* * * * *`).
    burst: int = 10_000
    burst_every_s: int | None = None
    progress: Callable[[str], None] = field(default=_quiet)
