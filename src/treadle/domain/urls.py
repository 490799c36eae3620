"""Database URL schemes treadle accepts and the SQLAlchemy driver each one maps to.

Pure: parses the text only. Whether a driver is installed is the store's concern.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from treadle.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """One kind of database server and the driver treadle talks to it with."""

    #: SQLAlchemy's dialect name: "sqlite", "postgresql" or "mysql" (MariaDB included).
    dialect: str
    #: The scheme SQLAlchemy is given (dialect+driver).
    driver_scheme: str
    #: Python module of the driver when it is an optional extra, else None.
    driver_module: str | None = None
    #: The pip extra that installs `driver_module`.
    extra: str | None = None


SQLITE = Backend(dialect="sqlite", driver_scheme="sqlite")
POSTGRESQL = Backend(
    dialect="postgresql", driver_scheme="postgresql+psycopg", driver_module="psycopg", extra="postgres"
)
MYSQL = Backend(dialect="mysql", driver_scheme="mysql+pymysql", driver_module="pymysql", extra="mysql")

#: Every scheme accepted, matched exactly (never by prefix).
SCHEMES: dict[str, Backend] = {
    "sqlite": SQLITE,
    "postgresql": POSTGRESQL,
    "postgres": POSTGRESQL,
    "postgresql+psycopg": POSTGRESQL,
    "mysql": MYSQL,
    "mariadb": MYSQL,
    "mysql+pymysql": MYSQL,
    "mariadb+pymysql": MYSQL,
}

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


@dataclass(frozen=True, slots=True, kw_only=True)
class DatabaseUrl:
    """A database URL split at its scheme."""

    #: The scheme as written (one of SCHEMES).
    scheme: str
    #: Everything after "://".
    rest: str
    backend: Backend

    @property
    def for_driver(self) -> str:
        """The URL with the scheme of the bundled driver (what SQLAlchemy is given)."""
        return f"{self.backend.driver_scheme}://{self.rest}"


def supported_schemes() -> str:
    """The accepted URL forms, for messages."""
    return ", ".join("sqlite:///PATH" if s == "sqlite" else f"{s}://" for s in SCHEMES)


def parse_database_url(url: str, *, setting: str = "TREADLE_DATABASE_URL") -> DatabaseUrl:
    """Split `url` at its scheme; ConfigError (naming `setting` and the schemes) if unsupported."""
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        # The text is not echoed: without a scheme there is no telling where a password is.
        raise ConfigError(
            f"{setting} is not a URL of the form SCHEME://...; supported: {supported_schemes()}"
        )
    backend = SCHEMES.get(scheme)
    if backend is None:
        raise ConfigError(f"{setting} has unsupported scheme {scheme}://; supported: {supported_schemes()}")
    if backend is SQLITE and not rest.startswith("/"):
        raise ConfigError(f"{setting} must name a file: sqlite:///PATH (three slashes), got {url!r}")
    return DatabaseUrl(scheme=scheme, rest=rest, backend=backend)


def sqlite_file(url: DatabaseUrl) -> PurePath | None:
    """The file a SQLite URL names (relative to the working directory if it is relative).

    None for other backends and for in-memory databases.
    """
    if url.backend is not SQLITE:
        return None
    # "sqlite:///x.db" is relative, "sqlite:////abs/x.db" absolute; a "?" starts driver options.
    path = url.rest[1:].partition("?")[0]
    if path in ("", ":memory:"):
        return None
    return PurePath(path)
