"""Settings of the API process and the checks that refuse an unsafe start (S1, S2)."""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from treadle.domain.urls import parse_database_url, sqlite_file
from treadle.engine.accounts import LoginLimits
from treadle.errors import ConfigError

#: Secret keys seen in examples and defaults everywhere: never accepted.
KNOWN_DEFAULT_SECRETS = frozenset(
    {
        "secret",
        "changeme",
        "change-me",
        "changethis",
        "treadle",
        "temporary_key",
        "development",
        "dev",
        "test",
    }
)
MIN_SECRET_LENGTH = 32
#: Where a local install keeps the secret key it generated for itself.
SECRET_FILE = "api_secret_key"


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiSettings:
    """What the API process reads from the environment (TREADLE_*)."""

    #: Signs session cookies; None: not set (a local install generates one).
    secret_key: str | None = None
    #: The bootstrap admin's first password; None: a random one, printed once.
    admin_password: str | None = None
    #: Mark cookies Secure even for plain-HTTP requests (TLS ends at a proxy in front).
    behind_tls: bool = False
    session_hours: float = 12.0
    #: /readyz wants a scheduler lease renewed within this many seconds.
    ready_scheduler_window_s: float = 60.0
    max_body_bytes: int = 1024 * 1024
    max_page_size: int = 500
    login_limits: LoginLimits = field(default_factory=LoginLimits)
    #: Serve /metrics without credentials (for scrapers that cannot send a token).
    metrics_public: bool = False
    #: How long a request's Idempotency-Key (and its recorded response) is kept for retries.
    idempotency_hours: float = 24.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ApiSettings:
        """Read the settings; ConfigError naming the variable that is wrong."""
        env = os.environ if env is None else env
        return cls(
            secret_key=env.get("TREADLE_SECRET_KEY") or None,
            admin_password=env.get("TREADLE_ADMIN_PASSWORD") or None,
            behind_tls=_flag(env, "TREADLE_API_BEHIND_TLS"),
            metrics_public=_flag(env, "TREADLE_API_METRICS_PUBLIC"),
            session_hours=_number(env, "TREADLE_API_SESSION_HOURS", 12.0, 0.01, 24 * 30),
            idempotency_hours=_number(env, "TREADLE_API_IDEMPOTENCY_HOURS", 24.0, 0.01, 24 * 30),
            ready_scheduler_window_s=_number(env, "TREADLE_API_READY_SCHEDULER_SECONDS", 60.0, 1, 86400),
            max_body_bytes=int(
                _number(env, "TREADLE_API_MAX_BODY_BYTES", 1024 * 1024, 1024, 64 * 1024 * 1024)
            ),
            login_limits=LoginLimits(
                per_user=int(_number(env, "TREADLE_API_LOGIN_FAILURES_PER_USER", 5, 1, 1000)),
                per_address=int(_number(env, "TREADLE_API_LOGIN_FAILURES_PER_ADDRESS", 20, 1, 10000)),
                window_s=_number(env, "TREADLE_API_LOGIN_WINDOW_SECONDS", 300, 1, 86400),
            ),
        )


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{name} must be 1/true/yes or 0/false/no, got {raw!r}")


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number in {low}..{high}, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be a number in {low}..{high}, got {raw!r}")
    return value


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`: addresses only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_local_sqlite(database_url: str) -> bool:
    """True when the database is a SQLite file on this machine."""
    return sqlite_file(parse_database_url(database_url)) is not None


def secret_key_problem(key: str | None) -> str | None:
    """Why `key` cannot sign sessions, or None."""
    how = (
        "set TREADLE_SECRET_KEY to a random value, "
        "e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`"
    )
    if key is None:
        return f"TREADLE_SECRET_KEY is not set: {how}"
    if key.strip().lower() in KNOWN_DEFAULT_SECRETS:
        return f"TREADLE_SECRET_KEY is a well-known default value: {how}"
    if len(key) < MIN_SECRET_LENGTH:
        return f"TREADLE_SECRET_KEY is shorter than {MIN_SECRET_LENGTH} characters: {how}"
    return None


def start_problems(
    *, host: str, database_url: str, secret_key: str | None, bootstrap_unchanged: bool
) -> list[str]:
    """Every reason the API must not start (empty: it may).

    Exposed (bound to a non-loopback address, or sharing a database other machines use), it
    needs its own strong secret key and a changed bootstrap password. A known default key is
    refused everywhere.
    """
    exposed = not is_loopback(host) or not is_local_sqlite(database_url)
    problems = []
    key_problem = secret_key_problem(secret_key)
    if key_problem and (exposed or secret_key is not None):
        problems.append(key_problem)
    if exposed and bootstrap_unchanged:
        problems.append(
            "the bootstrap password of user `admin` is unchanged: set a new one with "
            "`treadle users set-password admin` (or start once on 127.0.0.1 with a local SQLite "
            "file and POST /api/v1/auth/password)"
        )
    return problems


def local_secret_key(home: Path) -> str:
    """The secret key a local install generated for itself (created 0600 on first use)."""
    path = home / SECRET_FILE
    if path.exists():
        return path.read_text().strip()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_urlsafe(48)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use that one
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key
