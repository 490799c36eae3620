"""One typed settings object, read from `TREADLE_*` environment variables and validated at start."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from treadle.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Validated settings of one treadle process."""

    home: Path
    database_url: str
    dags_folder: Path
    #: How long a claimed attempt stays owned without a heartbeat.
    lease_s: float = 30.0
    #: How often a worker renews its leases; at most a third of lease_s (F3).
    heartbeat_s: float = 5.0
    #: Scheduler loop period (due retries, lease reaping, run completion).
    scheduler_tick_s: float = 0.5
    #: How often standalone and workers look for edited DAG files.
    dag_refresh_s: float = 2.0
    #: Largest JSON result a task may return.
    max_result_bytes: int = 64 * 1024
    #: Default longest wait in `queued` before an attempt ends `dispatch_timeout` (per task too).
    queue_timeout_s: float = 600.0
    #: Finished runs (with their attempts, results) older than this are pruned; 0 keeps all.
    retention_days: float = 0.0
    #: On SIGTERM, how long running attempts may finish before they are handed back.
    shutdown_grace_s: float = 30.0
    #: Lease of the scheduler leader (database clock); a standby takes over within about this.
    scheduler_lease_s: float = 3.0
    #: A scheduler whose host clock is further than this from the database's refuses to lead.
    max_clock_skew_s: float = 2.0
    #: Longest range of logical dates one backfill may cover.
    backfill_max_span_days: float = 366.0
    #: Longest a DAG file may take to import; past it the file is a load error.
    dag_import_timeout_s: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from the environment; errors name the variable at fault."""
        env = os.environ if env is None else env
        home = Path(env.get("TREADLE_HOME", "~/.treadle")).expanduser()
        url = env.get("TREADLE_DATABASE_URL") or f"sqlite:///{home / 'treadle.db'}"
        folder = Path(env.get("TREADLE_DAGS_FOLDER", str(home / "dags"))).expanduser()
        settings = cls(
            home=home,
            database_url=url,
            dags_folder=folder,
            lease_s=_number(env, "TREADLE_LEASE_SECONDS", 30.0),
            heartbeat_s=_number(env, "TREADLE_HEARTBEAT_SECONDS", 5.0),
            scheduler_tick_s=_number(env, "TREADLE_SCHEDULER_TICK_SECONDS", 0.5),
            dag_refresh_s=_number(env, "TREADLE_DAG_REFRESH_SECONDS", 2.0),
            max_result_bytes=int(_number(env, "TREADLE_MAX_RESULT_BYTES", 64 * 1024)),
            queue_timeout_s=_number(env, "TREADLE_QUEUE_TIMEOUT_SECONDS", 600.0),
            retention_days=_number(env, "TREADLE_RETENTION_DAYS", 0.0, allow_zero=True),
            shutdown_grace_s=_number(env, "TREADLE_SHUTDOWN_GRACE_SECONDS", 30.0, allow_zero=True),
            scheduler_lease_s=_number(env, "TREADLE_SCHEDULER_LEASE_SECONDS", 3.0),
            max_clock_skew_s=_number(env, "TREADLE_MAX_CLOCK_SKEW_SECONDS", 2.0),
            backfill_max_span_days=_number(env, "TREADLE_BACKFILL_MAX_SPAN_DAYS", 366.0),
            dag_import_timeout_s=_number(env, "TREADLE_DAG_IMPORT_TIMEOUT_SECONDS", 30.0),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise ConfigError naming the first inconsistent setting."""
        if not self.database_url.startswith(("sqlite:", "postgresql", "postgres:", "mysql", "mariadb")):
            raise ConfigError(
                f"TREADLE_DATABASE_URL must be a sqlite:///, postgresql:// or mysql:// URL, "
                f"got {self.database_url.split('://')[0]}://..."
            )
        if self.heartbeat_s * 3 > self.lease_s:
            raise ConfigError(
                f"TREADLE_LEASE_SECONDS ({self.lease_s}) must be at least 3 x "
                f"TREADLE_HEARTBEAT_SECONDS ({self.heartbeat_s}) so a slow heartbeat is not a death"
            )


def _number(env: Mapping[str, str], name: str, default: float, *, allow_zero: bool = False) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>=' if allow_zero else '>'} 0, got {raw!r}")
    return value
