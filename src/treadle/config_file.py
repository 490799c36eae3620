"""`treadle.toml`: every `TREADLE_*` setting in a file, the environment overriding it.

The file is `$TREADLE_HOME/treadle.toml` when it exists, or the one named by `treadle --config
PATH` (which sets TREADLE_CONFIG, so processes treadle starts read the same file). Its keys are
the variables' names without `TREADLE_`, in lower case (`lease_seconds = 30` is
TREADLE_LEASE_SECONDS); values are strings, numbers, booleans, or a list of strings for the
command allow-list. A key that names no setting is a ConfigError naming it. The result is one
mapping of variables, read by `Settings.from_env` and `ApiSettings.from_env` exactly as the
environment is, so a value has the same checks and messages wherever it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treadle.errors import ConfigError

FILE_NAME = "treadle.toml"
#: The variable `--config PATH` sets.
CONFIG_VARIABLE = "TREADLE_CONFIG"
#: Every setting a file may hold, by variable (the API's too); TREADLE_HOME locates the file.
VARIABLES: tuple[str, ...] = (
    "TREADLE_DATABASE_URL",
    "TREADLE_DAGS_FOLDER",
    "TREADLE_LOGS_FOLDER",
    "TREADLE_ARTIFACTS_URL",
    "TREADLE_COMMAND_ALLOWLIST",
    "TREADLE_DEFAULT_TASK_TIMEOUT",
    "TREADLE_LEASE_SECONDS",
    "TREADLE_HEARTBEAT_SECONDS",
    "TREADLE_SCHEDULER_TICK_SECONDS",
    "TREADLE_DAG_REFRESH_SECONDS",
    "TREADLE_MAX_RESULT_BYTES",
    "TREADLE_QUEUE_TIMEOUT_SECONDS",
    "TREADLE_RETENTION_DAYS",
    "TREADLE_SHUTDOWN_GRACE_SECONDS",
    "TREADLE_SCHEDULER_LEASE_SECONDS",
    "TREADLE_MAX_CLOCK_SKEW_SECONDS",
    "TREADLE_BACKFILL_MAX_SPAN_DAYS",
    "TREADLE_DAG_IMPORT_TIMEOUT_SECONDS",
    "TREADLE_MAX_MAP_LENGTH",
    "TREADLE_LOG_MAX_BYTES",
    "TREADLE_OUTBOX_WEBHOOK_URL",
    "TREADLE_OUTBOX_WEBHOOK_SECRET",
    "TREADLE_OUTBOX_MAX_ATTEMPTS",
    "TREADLE_OUTBOX_ACK_SECONDS",
    "TREADLE_OUTBOX_NATS_URL",
    "TREADLE_OUTBOX_NATS_SUBJECT_PREFIX",
    "TREADLE_OUTBOX_NATS_JETSTREAM",
    "TREADLE_ALERT_SLACK_URL",
    "TREADLE_ALERT_RULES",
    "TREADLE_ALERT_DEDUP_SECONDS",
    "TREADLE_ALERT_CHECK_SECONDS",
    "TREADLE_UI_BASE_URL",
    "TREADLE_SECRET_KEY",
    "TREADLE_ADMIN_PASSWORD",
    "TREADLE_API_BEHIND_TLS",
    "TREADLE_API_SESSION_HOURS",
    "TREADLE_API_IDEMPOTENCY_HOURS",
    "TREADLE_API_READY_SCHEDULER_SECONDS",
    "TREADLE_API_MAX_BODY_BYTES",
    "TREADLE_API_LOGIN_FAILURES_PER_USER",
    "TREADLE_API_LOGIN_FAILURES_PER_ADDRESS",
    "TREADLE_API_LOGIN_WINDOW_SECONDS",
)
#: Settings whose value is never shown (`treadle config show` says only whether it is set).
SECRETS = frozenset(
    {
        "TREADLE_SECRET_KEY",
        "TREADLE_ADMIN_PASSWORD",
        "TREADLE_OUTBOX_WEBHOOK_SECRET",
        "TREADLE_ALERT_SLACK_URL",
    }
)


def key_of(variable: str) -> str:
    """A variable's key in the file: `TREADLE_LEASE_SECONDS` -> `lease_seconds`."""
    return variable.removeprefix("TREADLE_").lower()


@dataclass(frozen=True, slots=True, kw_only=True)
class LayeredSettings:
    """The variables in effect: the file's values overlaid by the environment's."""

    env: dict[str, str]
    #: The file read, if any.
    path: Path | None = None
    #: The variables the file set.
    from_file: frozenset[str] = field(default_factory=frozenset)

    def source(self, variable: str, environ: Mapping[str, str]) -> str:
        """Where a variable's value comes from: "env", "file" or "default"."""
        if environ.get(variable):
            return "env"
        return "file" if variable in self.from_file else "default"


def settings_file(environ: Mapping[str, str]) -> Path | None:
    """The settings file to read: TREADLE_CONFIG's (which must exist), else treadle.toml in
    TREADLE_HOME if there is one."""
    named = environ.get(CONFIG_VARIABLE)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(f"settings file {path} (--config / {CONFIG_VARIABLE}) does not exist")
        return path
    home = Path(environ.get("TREADLE_HOME", "~/.treadle")).expanduser()
    path = home / FILE_NAME
    return path if path.is_file() else None


def load(environ: Mapping[str, str]) -> LayeredSettings:
    """The settings file's variables overlaid by the environment's; ConfigError naming the file
    and the key at fault."""
    path = settings_file(environ)
    if path is None:
        return LayeredSettings(env=dict(environ))
    values = read_file(path)
    merged = {**values, **{k: v for k, v in environ.items() if v}}
    return LayeredSettings(env=merged, path=path, from_file=frozenset(values))


def read_file(path: Path) -> dict[str, str]:
    """A settings file's values as variables (`lease_seconds` -> TREADLE_LEASE_SECONDS)."""
    import tomllib  # only when there is a file: most commands run without one

    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read settings file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"settings file {path} is not valid TOML: {exc}") from None
    known = {key_of(v): v for v in VARIABLES}
    out: dict[str, str] = {}
    for key, value in data.items():
        if key == "home":
            raise ConfigError(
                f"settings file {path}: 'home' cannot be set in the file; set TREADLE_HOME in the "
                "environment (the file is found through it) or name the file with --config"
            )
        variable = known.get(key)
        if variable is None:
            raise ConfigError(
                f"settings file {path}: unknown setting {key!r}; known settings: {', '.join(sorted(known))}"
            )
        out[variable] = _text(path, key, value)
    return out


def _text(path: Path, key: str, value: Any) -> str:
    """A file value as the environment would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise ConfigError(
        f"settings file {path}: {key} must be a string, a number, a boolean or a list of strings, "
        f"not {type(value).__name__}"
    )
