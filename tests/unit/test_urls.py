"""Database URLs: schemes matched exactly, each mapped to its bundled driver."""

from __future__ import annotations

from pathlib import PurePath

import pytest

from treadle.domain.urls import MYSQL, POSTGRESQL, SQLITE, parse_database_url, sqlite_file
from treadle.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "backend", "for_driver"),
    [
        ("sqlite:///x.db", SQLITE, "sqlite:///x.db"),
        ("sqlite:////abs/x.db", SQLITE, "sqlite:////abs/x.db"),
        ("postgresql://u@h/db", POSTGRESQL, "postgresql+psycopg://u@h/db"),
        ("postgres://u@h/db", POSTGRESQL, "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg://u@h/db", POSTGRESQL, "postgresql+psycopg://u@h/db"),
        ("mysql://u:p@h:3306/db", MYSQL, "mysql+pymysql://u:p@h:3306/db"),
        ("mariadb://u@h/db", MYSQL, "mysql+pymysql://u@h/db"),
        ("mysql+pymysql://u@h/db", MYSQL, "mysql+pymysql://u@h/db"),
        ("mariadb+pymysql://u@h/db", MYSQL, "mysql+pymysql://u@h/db"),
    ],
)
def test_supported_schemes(url: str, backend: object, for_driver: str) -> None:
    parsed = parse_database_url(url)
    assert parsed.backend is backend
    assert parsed.for_driver == for_driver


@pytest.mark.parametrize(
    "url",
    [
        "postgresqlx://h/db",
        "postgres+asyncpg://h/db",
        "mysqlx://h/db",
        "mariadbx://h/db",
        "http://h/db",
        "sqlite+pysqlite:///x.db",
        "Postgresql://h/db",
    ],
)
def test_anything_else_names_the_scheme_and_lists_the_supported_ones(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_database_url(url)
    message = str(info.value)
    assert message.startswith(f"TREADLE_DATABASE_URL has unsupported scheme {url.split('://')[0]}://;")
    assert message.endswith(
        "supported: sqlite:///PATH, postgresql://, postgres://, postgresql+psycopg://, "
        "mysql://, mariadb://, mysql+pymysql://, mariadb+pymysql://"
    )


@pytest.mark.parametrize("url", ["", "treadle.db", "user:secret@host/db", "postgresql:/h/db"])
def test_text_without_a_scheme_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(ConfigError, match="is not a URL of the form SCHEME://") as info:
        parse_database_url(url)
    assert "secret" not in str(info.value)


def test_sqlite_urls_must_name_a_file() -> None:
    with pytest.raises(ConfigError, match=r"must name a file: sqlite:///PATH \(three slashes\)"):
        parse_database_url("sqlite://")


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:////var/lib/treadle/t.db", PurePath("/var/lib/treadle/t.db")),
        ("sqlite:///rel/t.db", PurePath("rel/t.db")),
        ("sqlite:////a/t.db?timeout=3", PurePath("/a/t.db")),
        ("sqlite:///:memory:", None),
        ("postgresql://h/db", None),
    ],
)
def test_sqlite_file(url: str, path: PurePath | None) -> None:
    assert sqlite_file(parse_database_url(url)) == path
