"""One typed settings object, read from `TREADLE_*` environment variables and validated at start."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.domain.alerts import DEFAULT_DEDUP_S, DEFAULT_SYSTEM_RULES, Alerting, AlertRule, parse_rules
from treadle.domain.commands import parse_allowlist
from treadle.domain.durations import ACCEPTED_FORMS, DEFAULT_TASK_TIMEOUT_S, parse_duration
from treadle.domain.mapping import DEFAULT_MAX_MAP_LENGTH
from treadle.domain.urls import parse_database_url
from treadle.errors import ConfigError, InvalidRequest, SettingOutOfRange

if TYPE_CHECKING:
    from treadle.domain.admission import AdmissionLimits

MIB = 1024 * 1024
DAY_S = 24 * 3600
DEFAULT_SCHEDULER_LEASE_S = 3.0
DEFAULT_MAX_CLOCK_SKEW_S = 2.0


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
    #: Audit entries older than this are pruned; 0 keeps the whole audit log. Not below retention_days.
    audit_retention_days: float = 0.0
    #: On SIGTERM, how long running attempts may finish before they are handed back.
    shutdown_grace_s: float = 30.0
    #: Lease of the scheduler leader (database clock); a standby takes over within about this.
    scheduler_lease_s: float = DEFAULT_SCHEDULER_LEASE_S
    #: A scheduler whose host clock is further than this from the database's refuses to lead.
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    #: Longest range of logical dates one backfill may cover.
    backfill_max_span_days: float = 366.0
    #: Longest a DAG file may take to import; past it the file is a load error.
    dag_import_timeout_s: float = 30.0
    #: Where artifacts live (an fsspec URL); None: the local disk under `home`.
    artifacts_url: str | None = None
    #: Execution timeout of every task that sets no `timeout=` (None: such tasks may run forever).
    default_task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S
    #: Most instances a mapped task may expand into, unless the task sets its own max_map_length.
    max_map_length: int = DEFAULT_MAX_MAP_LENGTH
    #: Where attempt logs go on each worker's host (default $TREADLE_HOME/logs).
    logs_folder: Path | None = None
    #: Largest log of one attempt; past it the log says so and the rest is dropped.
    log_max_bytes: int = 200 * MIB
    #: Programs command tasks may run (absolute paths or file names, globs); empty: any.
    command_allowlist: tuple[str, ...] = ()
    #: Most queued task instances in one queue; new work past it is refused (0: no limit).
    max_queued_per_queue: int = 0
    #: Most queued task instances of one DAG; new work past it is refused (0: no limit).
    max_queued_per_dag: int = 0

    @property
    def admission_limits(self) -> AdmissionLimits:
        """The limits a trigger, a backfill or a dataset run must fit in."""
        from treadle.domain.admission import AdmissionLimits  # only commands that create runs need it

        return AdmissionLimits(per_queue=self.max_queued_per_queue, per_dag=self.max_queued_per_dag)

    #: Port of a scheduler's or worker's /metrics, /healthz and /readyz; None: not served.
    metrics_port: int | None = None
    #: Address that port listens on (0.0.0.0 for probes from outside the host or pod).
    metrics_host: str = "127.0.0.1"
    #: Process log format, "json" or "text"; None: text on a terminal, JSON elsewhere.
    log_format: str | None = None
    #: Where the outbox relay posts dataset events and dead-letter alerts; None: no outbox.
    outbox_webhook_url: str | None = None
    #: Signs each webhook body (HMAC-SHA256); None: unsigned.
    outbox_webhook_secret: str | None = None
    #: Deliveries of one entry before it is dead.
    outbox_max_attempts: int = 10
    #: How long a receiver has to acknowledge one delivery.
    outbox_ack_s: float = 10.0
    #: Where OpenLineage events go: an http(s) URL (the client's HTTP transport)...
    openlineage_url: str | None = None
    #: ...or a file that gets one JSON event per line; neither: no lineage events.
    openlineage_file: Path | None = None
    #: The OpenLineage namespace of treadle's jobs.
    openlineage_namespace: str = "treadle"
    #: NATS server(s) the relay publishes dataset events and alerts to (the `nats` extra).
    outbox_nats_url: str | None = None
    #: The first token(s) of every subject: `<prefix>.dataset.<name>`, `<prefix>.alert.<kind>.<dag>`.
    outbox_nats_subject_prefix: str = "treadle"
    #: Publish through JetStream and take its PubAck as the acknowledgement (else a flush).
    outbox_nats_jetstream: bool = False
    #: A Slack incoming-webhook URL (or any receiver of Slack's body) that gets the alerts.
    alert_slack_url: str | None = None
    #: The deployment's alert rules (None: dead_letter and freshness_miss).
    alert_rules: tuple[AlertRule, ...] | None = None
    #: Repeats of one rule about one subject within this window are recorded, not sent.
    alert_dedup_s: float = DEFAULT_DEDUP_S
    #: Seconds between the leader's checks of lasting states (and freshness).
    alert_check_s: float = 30.0
    #: The web UI's address, for the links in alerts.
    ui_base_url: str | None = None

    @property
    def outbox_sinks(self) -> tuple[str, ...]:
        """The sinks effects are written for: the webhook, NATS and Slack, those configured."""
        configured = (
            ("webhook", self.outbox_webhook_url),
            ("nats", self.outbox_nats_url),
            ("slack", self.alert_slack_url),
        )
        return tuple(sink for sink, where in configured if where)

    @property
    def alerting(self) -> Alerting:
        """The deployment's alert rules, window and UI address."""
        return Alerting(
            rules=DEFAULT_SYSTEM_RULES if self.alert_rules is None else self.alert_rules,
            dedup_s=self.alert_dedup_s,
            check_s=self.alert_check_s,
            ui_base_url=self.ui_base_url,
        )

    @property
    def lineage_namespace(self) -> str | None:
        """The namespace lineage events are written with; None when lineage is off."""
        enabled = self.openlineage_url is not None or self.openlineage_file is not None
        return self.openlineage_namespace if enabled else None

    @property
    def logs_dir(self) -> Path:
        """The attempt logs' folder."""
        return self.logs_folder if self.logs_folder is not None else self.home / "logs"

    @property
    def runs_dir(self) -> Path:
        """Where each run's manifest and command outputs live on a worker's host."""
        return self.home / "runs"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from the environment; errors name the variable at fault."""
        env = os.environ if env is None else env
        home = Path(env.get("TREADLE_HOME", "~/.treadle")).expanduser()
        url = env.get("TREADLE_DATABASE_URL") or f"sqlite:///{home / 'treadle.db'}"
        folder = Path(env.get("TREADLE_DAGS_FOLDER", str(home / "dags"))).expanduser()
        numbers: dict[str, Any] = {
            spec.field: _number(spec, env[spec.variable])
            for spec in NUMERIC_SETTINGS
            if env.get(spec.variable)
        }
        if "max_clock_skew_s" not in numbers:
            # The default follows a short scheduler lease down so that it stays below it.
            lease_s = numbers.get("scheduler_lease_s", DEFAULT_SCHEDULER_LEASE_S)
            short = lease_s <= DEFAULT_MAX_CLOCK_SKEW_S
            numbers["max_clock_skew_s"] = lease_s / 2 if short else DEFAULT_MAX_CLOCK_SKEW_S
        if env.get(DEFAULT_TASK_TIMEOUT.variable):
            numbers["default_task_timeout_s"] = parse_task_timeout(env[DEFAULT_TASK_TIMEOUT.variable])
        logs = env.get("TREADLE_LOGS_FOLDER")
        settings = cls(
            home=home,
            database_url=url,
            dags_folder=folder,
            artifacts_url=env.get("TREADLE_ARTIFACTS_URL") or None,
            logs_folder=Path(logs).expanduser() if logs else None,
            command_allowlist=parse_allowlist(env.get("TREADLE_COMMAND_ALLOWLIST", "")),
            metrics_port=parse_metrics_port(env.get("TREADLE_METRICS_PORT", "")),
            metrics_host=env.get("TREADLE_METRICS_HOST") or "127.0.0.1",
            log_format=parse_log_format(env.get("TREADLE_LOG_FORMAT", "")),
            outbox_webhook_url=parse_webhook_url(env.get("TREADLE_OUTBOX_WEBHOOK_URL", "")),
            outbox_webhook_secret=env.get("TREADLE_OUTBOX_WEBHOOK_SECRET") or None,
            openlineage_url=parse_webhook_url(
                env.get("TREADLE_OPENLINEAGE_URL", ""), name="TREADLE_OPENLINEAGE_URL"
            ),
            openlineage_file=parse_lineage_file(env.get("TREADLE_OPENLINEAGE_FILE", "")),
            openlineage_namespace=parse_namespace(env.get("TREADLE_OPENLINEAGE_NAMESPACE", "")),
            outbox_nats_url=parse_nats_url(env.get("TREADLE_OUTBOX_NATS_URL", "")),
            outbox_nats_subject_prefix=parse_subject_prefix(
                env.get("TREADLE_OUTBOX_NATS_SUBJECT_PREFIX", "")
            ),
            outbox_nats_jetstream=parse_flag(
                env.get("TREADLE_OUTBOX_NATS_JETSTREAM", ""), "TREADLE_OUTBOX_NATS_JETSTREAM"
            ),
            alert_slack_url=parse_webhook_url(
                env.get("TREADLE_ALERT_SLACK_URL", ""), name="TREADLE_ALERT_SLACK_URL"
            ),
            alert_rules=parse_alert_rules(env.get("TREADLE_ALERT_RULES", "")),
            ui_base_url=parse_webhook_url(env.get("TREADLE_UI_BASE_URL", ""), name="TREADLE_UI_BASE_URL"),
            **numbers,
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise ConfigError naming the first invalid or inconsistent setting."""
        parse_database_url(self.database_url)
        if self.artifacts_url is not None:
            from treadle.authoring.artifacts import check_artifacts_url

            problem = check_artifacts_url(self.artifacts_url)
            if problem is not None:
                raise ConfigError(problem)
        for spec in NUMERIC_SETTINGS:
            spec.check(getattr(self, spec.field))
        if self.default_task_timeout_s is not None:
            DEFAULT_TASK_TIMEOUT.check(self.default_task_timeout_s)
        if self.openlineage_url is not None and self.openlineage_file is not None:
            raise ConfigError(
                "set one of TREADLE_OPENLINEAGE_URL and TREADLE_OPENLINEAGE_FILE, not both "
                f"(got {self.openlineage_url!r} and {str(self.openlineage_file)!r})"
            )
        if self.outbox_nats_url is not None:
            _require_nats_client()
        if self.heartbeat_s * 3 > self.lease_s:
            raise ConfigError(
                f"TREADLE_LEASE_SECONDS ({self.lease_s}) must be at least 3 x "
                f"TREADLE_HEARTBEAT_SECONDS ({self.heartbeat_s}) so a slow heartbeat is not a death"
            )
        if 0 < self.audit_retention_days < self.retention_days:
            raise ConfigError(
                f"TREADLE_AUDIT_RETENTION_DAYS ({self.audit_retention_days}) must be 0 (keep the whole "
                f"audit log) or at least TREADLE_RETENTION_DAYS ({self.retention_days}): an audit entry "
                "outlives the history it describes"
            )
        if self.max_clock_skew_s >= self.scheduler_lease_s:
            raise ConfigError(
                f"TREADLE_MAX_CLOCK_SKEW_SECONDS ({self.max_clock_skew_s}) must be below "
                f"TREADLE_SCHEDULER_LEASE_SECONDS ({self.scheduler_lease_s}): a leader whose clock "
                "is off by a whole lease cannot judge when its lease ends"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class NumericSetting:
    """The allowed range of one numeric setting (bounds included)."""

    variable: str
    #: The Settings attribute it fills.
    field: str
    low: float
    high: float
    unit: str
    #: Also shown after the range, e.g. "16 MiB".
    note: str = ""
    is_integer: bool = False

    @property
    def allowed(self) -> str:
        """The allowed values in words, e.g. "a finite number of seconds in 1..3600"."""
        kind = "a whole number" if self.is_integer else "a finite number"
        note = f" ({self.note})" if self.note else ""
        return f"{kind} of {self.unit} in {_plain(self.low)}..{_plain(self.high)}{note}"

    def check(self, value: float) -> None:
        """Raise SettingOutOfRange unless `value` is finite, within range and whole if it must be."""
        whole = not self.is_integer or float(value).is_integer()
        if not (math.isfinite(value) and self.low <= value <= self.high and whole):
            raise SettingOutOfRange(setting=self.variable, value=value, allowed=self.allowed)


def _spec(
    variable: str, field: str, low: float, high: float, unit: str = "seconds", **more: Any
) -> NumericSetting:
    return NumericSetting(variable=variable, field=field, low=low, high=high, unit=unit, **more)


#: Every numeric setting with its range (README.md's Configuration table shows the same).
NUMERIC_SETTINGS: tuple[NumericSetting, ...] = (
    _spec("TREADLE_LEASE_SECONDS", "lease_s", 1, 3600),
    _spec("TREADLE_HEARTBEAT_SECONDS", "heartbeat_s", 0.1, 1200),
    _spec("TREADLE_SCHEDULER_TICK_SECONDS", "scheduler_tick_s", 0.05, 60),
    _spec("TREADLE_DAG_REFRESH_SECONDS", "dag_refresh_s", 0.1, 3600),
    _spec(
        "TREADLE_MAX_RESULT_BYTES", "max_result_bytes", 1, 16 * MIB, "bytes", note="16 MiB", is_integer=True
    ),
    _spec("TREADLE_QUEUE_TIMEOUT_SECONDS", "queue_timeout_s", 1, 30 * DAY_S, note="30 days"),
    _spec("TREADLE_RETENTION_DAYS", "retention_days", 0, 36500, "days", note="0 keeps everything"),
    _spec(
        "TREADLE_AUDIT_RETENTION_DAYS",
        "audit_retention_days",
        0,
        36500,
        "days",
        note="0 keeps the whole audit log",
    ),
    _spec("TREADLE_SHUTDOWN_GRACE_SECONDS", "shutdown_grace_s", 0, 3600),
    _spec("TREADLE_SCHEDULER_LEASE_SECONDS", "scheduler_lease_s", 1, 600),
    _spec("TREADLE_MAX_CLOCK_SKEW_SECONDS", "max_clock_skew_s", 0.01, 600, note="below the scheduler lease"),
    _spec("TREADLE_BACKFILL_MAX_SPAN_DAYS", "backfill_max_span_days", 1, 36500, "days"),
    _spec("TREADLE_DAG_IMPORT_TIMEOUT_SECONDS", "dag_import_timeout_s", 0.1, 3600),
    _spec("TREADLE_MAX_MAP_LENGTH", "max_map_length", 1, 1_000_000, "instances", is_integer=True),
    _spec("TREADLE_LOG_MAX_BYTES", "log_max_bytes", 1024, 1024**4, "bytes", note="1 TiB", is_integer=True),
    _spec(
        "TREADLE_MAX_QUEUED_PER_QUEUE",
        "max_queued_per_queue",
        0,
        100_000_000,
        "task instances",
        note="0: no limit",
        is_integer=True,
    ),
    _spec(
        "TREADLE_MAX_QUEUED_PER_DAG",
        "max_queued_per_dag",
        0,
        100_000_000,
        "task instances",
        note="0: no limit",
        is_integer=True,
    ),
    _spec("TREADLE_OUTBOX_MAX_ATTEMPTS", "outbox_max_attempts", 1, 1000, "deliveries", is_integer=True),
    _spec("TREADLE_OUTBOX_ACK_SECONDS", "outbox_ack_s", 0.1, 300),
    _spec("TREADLE_ALERT_DEDUP_SECONDS", "alert_dedup_s", 0, 366 * DAY_S, note="0: every repeat is sent"),
    _spec("TREADLE_ALERT_CHECK_SECONDS", "alert_check_s", 0.5, 3600),
)


#: TREADLE_DEFAULT_TASK_TIMEOUT: seconds or a duration ("24h"); "0", "none" or "off" turn it off.
DEFAULT_TASK_TIMEOUT = _spec(
    "TREADLE_DEFAULT_TASK_TIMEOUT",
    "default_task_timeout_s",
    1,
    366 * DAY_S,
    note="366 days; 0, none or off: no default timeout",
)

#: What turns the default task timeout off.
_NO_TIMEOUT = ("0", "none", "off")


def parse_task_timeout(raw: str) -> float | None:
    """TREADLE_DEFAULT_TASK_TIMEOUT in seconds (None: off); ConfigError naming the variable."""
    text = raw.strip().lower()
    if text in _NO_TIMEOUT:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text).total_seconds()
        except InvalidRequest:
            raise ConfigError(
                f"{DEFAULT_TASK_TIMEOUT.variable} must be a number of seconds, {ACCEPTED_FORMS}, "
                f"or one of {', '.join(_NO_TIMEOUT)} (no default timeout), got {raw!r}"
            ) from None
    DEFAULT_TASK_TIMEOUT.check(seconds)
    return seconds


def parse_metrics_port(raw: str) -> int | None:
    """TREADLE_METRICS_PORT: a TCP port in 1..65535; empty: no metrics port."""
    text = raw.strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ConfigError(f"TREADLE_METRICS_PORT must be a TCP port in 1..65535, got {raw!r}")
    return int(text)


def parse_webhook_url(raw: str, *, name: str = "TREADLE_OUTBOX_WEBHOOK_URL") -> str | None:
    """TREADLE_OUTBOX_WEBHOOK_URL (or `name`): an http(s) URL with a host; empty: none."""
    text = raw.strip()
    if not text:
        return None
    scheme, sep, rest = text.partition("://")
    if scheme.lower() not in ("http", "https") or not sep or not rest.split("/")[0]:
        raise ConfigError(f"{name} must be an http:// or https:// URL, got {raw!r}")
    return text


def _require_nats_client() -> None:
    """ConfigError naming the `nats` extra when nats-py cannot be imported."""
    try:
        import nats  # noqa: F401
    except ImportError:
        raise ConfigError(
            "TREADLE_OUTBOX_NATS_URL is set, but the NATS client is not installed: "
            "pip install 'treadle[nats]' (nats-py)"
        ) from None


def parse_nats_url(raw: str) -> str | None:
    """TREADLE_OUTBOX_NATS_URL: nats:// (or tls://) URLs, comma-separated; empty: none."""
    text = raw.strip()
    if not text:
        return None
    for url in (u.strip() for u in text.split(",")):
        scheme, sep, rest = url.partition("://")
        if scheme.lower() not in ("nats", "tls") or not sep or not rest.split("/")[0]:
            raise ConfigError(f"TREADLE_OUTBOX_NATS_URL must be nats:// or tls:// URLs, got {raw!r}")
    return text


def parse_subject_prefix(raw: str) -> str:
    """TREADLE_OUTBOX_NATS_SUBJECT_PREFIX: subject tokens without wildcards or blanks."""
    text = raw.strip() or "treadle"
    tokens = text.split(".")
    if any(not t or any(c in t for c in "*> \t") for t in tokens) or len(text) > 200:
        raise ConfigError(
            "TREADLE_OUTBOX_NATS_SUBJECT_PREFIX must be NATS subject tokens separated by dots, "
            f"without *, > or blanks (e.g. treadle or prod.treadle), got {raw!r}"
        )
    return text


def parse_flag(raw: str, name: str) -> bool:
    """A true/false setting (1/0, yes/no, on/off); empty: false."""
    text = raw.strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def parse_alert_rules(raw: str) -> tuple[AlertRule, ...] | None:
    """TREADLE_ALERT_RULES (domain/alerts.parse_rules); empty: the default rules."""
    if not raw.strip():
        return None
    try:
        return parse_rules(raw)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def parse_lineage_file(raw: str) -> Path | None:
    """TREADLE_OPENLINEAGE_FILE: a file path (its folder must exist); empty: none."""
    text = raw.strip()
    if not text:
        return None
    path = Path(text).expanduser()
    if not path.parent.is_dir():
        raise ConfigError(f"TREADLE_OPENLINEAGE_FILE {raw!r}: folder {str(path.parent)!r} does not exist")
    return path


def parse_namespace(raw: str) -> str:
    """TREADLE_OPENLINEAGE_NAMESPACE: a non-blank name without spaces; empty: "treadle"."""
    text = raw.strip()
    if not text:
        return "treadle"
    if any(c.isspace() for c in text):
        raise ConfigError(f"TREADLE_OPENLINEAGE_NAMESPACE must not contain spaces, got {raw!r}")
    return text


def parse_log_format(raw: str) -> str | None:
    """TREADLE_LOG_FORMAT: json or text; empty: chosen by whether stderr is a terminal."""
    text = raw.strip().lower()
    if not text:
        return None
    if text not in ("json", "text"):
        raise ConfigError(f"TREADLE_LOG_FORMAT must be json or text, got {raw!r}")
    return text


def _number(spec: NumericSetting, raw: str) -> float | int:
    """Parse and check one numeric variable (before any int conversion could fail on nan)."""
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{spec.variable} must be {spec.allowed}, got {raw!r}") from None
    spec.check(value)
    return int(value) if spec.is_integer else value


def _plain(x: float) -> str:
    """1.0 -> "1", 0.05 -> "0.05", 2592000.0 -> "2592000"."""
    return str(int(x)) if float(x).is_integer() else str(x)
