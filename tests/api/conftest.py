"""An in-process API on a fresh database, with users in two teams and their tokens."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from tests.api.dags_for_api import fin_broken, fin_report, ops_daily
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.access import ALL_TEAMS, Role
from treadle.engine import accounts
from treadle.engine.accounts import Caller, LoginLimits
from treadle.engine.dags import sync_dags
from treadle.store.database import Database

PASSWORD = "correct horse battery staple"
SECRET = "k" * 48
BY = Caller(actor="test")


@dataclass
class Api:
    """The app, its database, and a token per test persona."""

    db: Database
    client: TestClient
    tokens: dict[str, str] = field(default_factory=dict)

    def as_(self, who: str) -> dict[str, str]:
        """Headers authenticating as persona `who`."""
        return {"Authorization": f"Bearer {self.tokens[who]}"}


#: persona -> (team, role) of the user and its token.
PERSONAS = {
    "admin": (ALL_TEAMS, Role.ADMIN),
    "fin_operator": ("finance", Role.OPERATOR),
    "fin_viewer": ("finance", Role.VIEWER),
    "ops_operator": ("ops", Role.OPERATOR),
    "nobody": ("ops", Role.VIEWER),
}


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """argon2 at its smallest cost: the tests hash dozens of passwords on a busy machine."""
    from argon2 import PasswordHasher

    cheap = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    monkeypatch.setattr(accounts, "_hasher", lambda: cheap)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def api_db_url(request: pytest.FixtureRequest) -> str:
    """SQLite and PostgreSQL (the API's logic is dialect-free; the store suite covers MariaDB)."""
    url: str = request.getfixturevalue({"sqlite": "sqlite_url", "postgresql": "pg_url"}[request.param])
    return url


def make_client(db: Database, **settings: object) -> TestClient:
    """A TestClient on a new app over `db`."""
    app = create_app(db, ApiSettings(**settings), secret_key=SECRET)  # type: ignore[arg-type]
    return TestClient(app)


@pytest.fixture
def api(api_db_url: str) -> Iterator[Api]:
    """Users and tokens per persona, three DAGs (two in `finance`, one in `default`)."""
    db = Database(api_db_url)
    sync_dags(
        db,
        structures=[d.structure() for d in (fin_report, fin_broken, ops_daily)],
        scanned_files=[],
        errors={"/dags/bad.py": ("SyntaxError: bad", "Traceback ...")},
    )
    for team in ("finance", "ops"):
        accounts.create_team(db, team, by=BY)
    found = Api(
        db=db, client=make_client(db, login_limits=LoginLimits(per_user=3, per_address=6, window_s=60))
    )
    for name, (team, role) in PERSONAS.items():
        accounts.create_user(db, name, PASSWORD, team=team, role=role, by=BY)
        secret, _ = accounts.create_token(
            db, name, name=f"{name}-t", team=team, role=role, expires_in=None, by=BY
        )
        found.tokens[name] = secret
    # `nobody` loses its only role after making its token: the token then carries no grant.
    accounts.set_role(db, "nobody", team="ops", role=None, by=BY)
    yield found
    found.client.close()
    db.dispose()


def login(client: TestClient, username: str, password: str = PASSWORD) -> str:
    """Sign in; returns the CSRF token (the cookie stays in the client)."""
    response = client.post("/api/v1/auth/login", json={"username": username, "password": password})
    assert response.status_code == 200, response.text
    token: str = response.json()["csrf_token"]
    return token
