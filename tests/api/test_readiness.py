"""/readyz when the database cannot be reached: 503, every check named, no hang."""

from __future__ import annotations

import warnings

import pytest

from tests.api.conftest import SECRET
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.store.database import Database

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_readyz_is_unready_naming_every_check_when_the_database_is_down() -> None:
    # Nothing listens on port 1: the connection is refused at once.
    db = Database("postgresql://postgres@127.0.0.1:1/treadle")
    try:
        with TestClient(create_app(db, ApiSettings(), secret_key=SECRET)) as client:
            response = client.get("/readyz")
            assert response.status_code == 503
            body = response.json()
            assert body["status"] == "unavailable"
            checks = {c["name"]: c for c in body["checks"]}
            assert list(checks) == ["database", "schema", "scheduler"]
            assert not any(c["ok"] for c in checks.values())
            assert "unreachable" in checks["schema"]["detail"]
            # Liveness does not touch the database.
            assert client.get("/healthz").status_code == 200
    finally:
        db.dispose()
