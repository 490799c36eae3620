"""Probes, and the checks that refuse an unsafe start."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.api.conftest import Api
from treadle.api.settings import ApiSettings, is_loopback, local_secret_key, start_problems
from treadle.errors import ConfigError
from treadle.store import leases
from treadle.store.database import db_now

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _checks(body: dict) -> dict[str, bool]:  # type: ignore[type-arg]
    return {c["name"]: c["ok"] for c in body["checks"]}


def test_healthz_and_readyz_name_every_check(api: Api) -> None:
    assert api.client.get("/healthz").json() == {
        "status": "ok",
        "checks": [{"name": "process", "ok": True, "detail": "serving"}],
    }
    unready = api.client.get("/readyz")
    assert unready.status_code == 503
    assert _checks(unready.json()) == {"database": True, "schema": True, "scheduler": False}
    with api.db.begin() as conn:
        leases.acquire(conn, "scheduler", holder="s1", epoch=None, lease_s=10, now=db_now(conn))
    ready = api.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert _checks(ready.json()) == {"database": True, "schema": True, "scheduler": True}


def test_readyz_goes_unready_when_the_schema_is_behind(api: Api) -> None:
    with api.db.begin() as conn:
        leases.acquire(conn, "scheduler", holder="s1", epoch=None, lease_s=10, now=db_now(conn))
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0006'")
    response = api.client.get("/readyz")
    assert response.status_code == 503
    schema = next(c for c in response.json()["checks"] if c["name"] == "schema")
    assert schema == {"name": "schema", "ok": False, "detail": "at 0006, code expects 0013"}


def test_readyz_goes_unready_when_the_scheduler_lease_is_stale(api: Api) -> None:
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    with api.db.begin() as conn:
        leases.acquire(conn, "scheduler", holder="s1", epoch=None, lease_s=10, now=long_ago)
    body = api.client.get("/readyz").json()
    assert _checks(body)["scheduler"] is False


GOOD_KEY = "v" * 40
LOCAL = "sqlite:////tmp/treadle.db"
SHARED = "postgresql://treadle@db.internal/treadle"


@pytest.mark.parametrize(
    ("host", "url", "key", "unchanged", "expected"),
    [
        ("127.0.0.1", LOCAL, None, True, []),
        ("127.0.0.1", LOCAL, "changeme", False, ["well-known default"]),
        ("0.0.0.0", LOCAL, None, False, ["TREADLE_SECRET_KEY is not set"]),
        ("0.0.0.0", LOCAL, "short", False, ["shorter than 32"]),
        ("0.0.0.0", LOCAL, GOOD_KEY, True, ["bootstrap password"]),
        ("127.0.0.1", SHARED, None, True, ["TREADLE_SECRET_KEY is not set", "bootstrap password"]),
        ("::1", SHARED, GOOD_KEY, False, []),
        ("10.0.0.5", LOCAL, GOOD_KEY, False, []),
    ],
)
def test_start_problems(host: str, url: str, key: str | None, unchanged: bool, expected: list[str]) -> None:
    found = start_problems(host=host, database_url=url, secret_key=key, bootstrap_unchanged=unchanged)
    assert len(found) == len(expected)
    for problem, words in zip(found, expected, strict=True):
        assert words in problem


def test_loopback_and_settings_parsing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    with pytest.raises(ConfigError, match="TREADLE_API_BEHIND_TLS"):
        ApiSettings.from_env({"TREADLE_API_BEHIND_TLS": "maybe"})
    with pytest.raises(ConfigError, match="TREADLE_API_LOGIN_FAILURES_PER_USER"):
        ApiSettings.from_env({"TREADLE_API_LOGIN_FAILURES_PER_USER": "0"})
    key = local_secret_key(tmp_path / "home")
    assert local_secret_key(tmp_path / "home") == key and len(key) >= 32
    assert (tmp_path / "home" / "api_secret_key").stat().st_mode & 0o777 == 0o600
