"""Bad input and a bad environment through the real CLI: a non-zero exit, a message that names
the problem, and never a Python traceback."""

from __future__ import annotations

import json
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from treadle.store import migrate
from treadle.store.database import Database

pytestmark = pytest.mark.e2e

SUPPORTED = (
    "supported: sqlite:///PATH, postgresql://, postgres://, postgresql+psycopg://, "
    "mysql://, mariadb://, mysql+pymysql://, mariadb+pymysql://"
)


def refused(done: subprocess.CompletedProcess[str], *, code: int, message: str) -> None:
    """The command failed with `code`, said `message` on stderr and printed no traceback."""
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert done.returncode == code, output
    assert message in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        (
            "TREADLE_LEASE_SECONDS",
            "nan",
            "TREADLE_LEASE_SECONDS must be a finite number of seconds in 1..3600, got nan",
        ),
        (
            "TREADLE_LEASE_SECONDS",
            "inf",
            "TREADLE_LEASE_SECONDS must be a finite number of seconds in 1..3600, got inf",
        ),
        (
            "TREADLE_HEARTBEAT_SECONDS",
            "-inf",
            "TREADLE_HEARTBEAT_SECONDS must be a finite number of seconds in 0.1..1200, got -inf",
        ),
        (
            "TREADLE_SCHEDULER_TICK_SECONDS",
            "1e-9",
            "TREADLE_SCHEDULER_TICK_SECONDS must be a finite number of seconds in 0.05..60, got 1e-09",
        ),
        (
            "TREADLE_MAX_RESULT_BYTES",
            "0.5",
            "TREADLE_MAX_RESULT_BYTES must be a whole number of bytes in 1..16777216 (16 MiB), got 0.5",
        ),
    ],
)
def test_settings_that_are_not_finite_or_out_of_range(
    sqlite_url: str, cluster: Callable[..., Cluster], variable: str, raw: str, message: str
) -> None:
    c = cluster(sqlite_url, **{variable: raw})
    refused(c.cli("dags", "list"), code=2, message=message)


@pytest.mark.parametrize(
    "url", ["postgresqlx://u@127.0.0.1/db", "mysqlx://u@127.0.0.1/db", "http://127.0.0.1/db"]
)
def test_database_url_schemes_are_matched_exactly(url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(url)
    for args in (("dags", "list"), ("db", "upgrade")):
        done = c.cli(*args)
        refused(done, code=2, message=f"has unsupported scheme {url.split('://')[0]}://")
        assert SUPPORTED in done.stderr


def without(c: Cluster, tmp_path: Path, module: str) -> None:
    """Make `module` fail to import in `c`'s processes: a package that raises ImportError, first on
    the path (what Python sees when the package is not installed)."""
    shadow = tmp_path / f"without-{module}"
    (shadow / module).mkdir(parents=True)
    (shadow / module / "__init__.py").write_text(f"raise ImportError(\"No module named '{module}'\")\n")
    c.env["PYTHONPATH"] = f"{shadow}:{c.env.get('PYTHONPATH', '')}"


def test_a_mysql_url_without_pymysql_names_the_extra(tmp_path: Path, cluster: Callable[..., Cluster]) -> None:
    c = cluster("mariadb://root@127.0.0.1:3306/test")
    without(c, tmp_path, "pymysql")
    message = 'mariadb:// URLs need the pymysql driver, which is not installed: pip install "treadle[mysql]"'
    refused(c.cli("dags", "list"), code=2, message=message)


#: Every entry point that opens the database: one-shot commands and the long-running processes.
ENTRY_POINTS = [("dags", "list"), ("db", "upgrade"), ("worker",), ("scheduler",), ("standalone",), ("api",)]


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg"])
def test_a_postgresql_url_without_psycopg_names_the_extra(
    tmp_path: Path, cluster: Callable[..., Cluster], scheme: str
) -> None:
    c = cluster(f"{scheme}://postgres@127.0.0.1:5432/test")
    without(c, tmp_path, "psycopg")
    message = (
        f'{scheme}:// URLs need the psycopg driver, which is not installed: pip install "treadle[postgres]"'
    )
    for args in ENTRY_POINTS:
        refused(c.cli(*args), code=2, message=message)


def test_sqlite_needs_neither_psycopg_nor_pymysql(tmp_path: Path, cluster: Callable[..., Cluster]) -> None:
    c = cluster(f"sqlite:///{tmp_path / 'fresh.db'}")
    for module in ("psycopg", "pymysql", "openlineage"):
        without(c, tmp_path, module)
    for args in (("db", "upgrade"), ("dags", "list")):
        done = c.cli(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", ["scheduler", "standalone"])
def test_lineage_without_the_openlineage_client_names_the_extra(
    sqlite_url: str, tmp_path: Path, cluster: Callable[..., Cluster], command: str
) -> None:
    c = cluster(sqlite_url, TREADLE_OPENLINEAGE_FILE=str(tmp_path / "lineage.jsonl"))
    without(c, tmp_path, "openlineage")
    message = (
        "TREADLE_OPENLINEAGE_URL or TREADLE_OPENLINEAGE_FILE is set, but the OpenLineage client is not "
        "installed: pip install 'treadle[lineage]' (openlineage-python)"
    )
    refused(c.cli(command), code=2, message=message)


@pytest.mark.parametrize("command", ["scheduler", "standalone"])
def test_a_proxy_the_sinks_cannot_use_is_refused_by_name(
    sqlite_url: str, cluster: Callable[..., Cluster], command: str
) -> None:
    c = cluster(
        sqlite_url,
        TREADLE_OUTBOX_WEBHOOK_URL="https://hooks.example.invalid/in",
        HTTPS_PROXY="socks5://127.0.0.1:1080",
        NO_PROXY="",
        no_proxy="",
    )
    message = "HTTPS_PROXY must be an http:// proxy URL with a host, got 'socks5://127.0.0.1:1080'"
    refused(c.cli(command), code=2, message=message)


@pytest.mark.parametrize("fixture", ["sqlite_url", pytest.param("pg_url", marks=pytest.mark.postgres)])
def test_a_database_newer_than_the_code_is_refused_plainly(
    request: pytest.FixtureRequest, cluster: Callable[..., Cluster], fixture: str
) -> None:
    url: str = request.getfixturevalue(fixture)
    db = Database(url)
    with db.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    db.dispose()
    c = cluster(url)
    message = (
        f"database is at revision 9999, newer than this treadle (expects {migrate.head_revision()}): "
        "upgrade treadle, do not downgrade the database"
    )
    for args in (("dags", "list"), ("db", "upgrade"), ("db", "check")):
        refused(c.cli(*args), code=3, message=message)
    # Nothing was downgraded or rewritten.
    db = Database(url)
    assert migrate.current_revision(db) == "9999"
    db.dispose()


def test_missing_sqlite_folders_are_created_private(tmp_path: Path, cluster: Callable[..., Cluster]) -> None:
    path = tmp_path / "not" / "yet" / "there" / "treadle.db"
    c = cluster(f"sqlite:///{path}")
    done = c.cli("db", "upgrade")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert path.exists()
    for folder in (tmp_path / "not", tmp_path / "not" / "yet", path.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    listed = c.cli("dags", "list")
    assert listed.returncode == 0, listed.stderr


def test_a_sqlite_folder_that_cannot_be_created_is_named(
    tmp_path: Path, cluster: Callable[..., Cluster]
) -> None:
    (tmp_path / "plain-file").write_text("")
    path = tmp_path / "plain-file" / "sub" / "treadle.db"
    c = cluster(f"sqlite:///{path}")
    message = (
        f"cannot create folder {tmp_path / 'plain-file'} for the SQLite database {path}: a file is in the way"
    )
    for args in (("db", "upgrade"), ("dags", "list")):
        refused(c.cli(*args), code=2, message=message)


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_deeply_nested_conf_is_refused_before_parsing(
    sqlite_url: str, cluster: Callable[..., Cluster], opening: str
) -> None:
    closing = "]" if opening == "[" else "}"
    conf = '{"a":' + opening * 4999 + "1" + closing * 4999 + "}"
    c = cluster(sqlite_url)
    refused(
        c.cli("dags", "trigger", "any", "--conf", conf),
        code=1,
        message="--conf is nested 5000 levels deep, over the maximum depth of 32 levels",
    )


def test_oversized_conf_is_refused_naming_the_limit(sqlite_url: str, cluster: Callable[..., Cluster]) -> None:
    conf = json.dumps({"blob": "x" * (64 * 1024)})
    c = cluster(sqlite_url)
    refused(
        c.cli("dags", "trigger", "any", "--conf", conf),
        code=1,
        message=f"conf is {len(conf)} bytes as JSON, over the limit of 65536 bytes (64 KiB)",
    )
