"""The web UI in-process (TestClient) over a real SQLite file, with DAGs run by treadle.testing."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from tests.web.dags_for_web import MARKER_ENV, ops_cleanup, web_pipeline
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.access import ALL_TEAMS, Role
from treadle.engine import accounts
from treadle.engine.accounts import Caller
from treadle.engine.dags import sync_dags
from treadle.store.database import Database
from treadle.testing import DagRunner

PASSWORD = "correct horse battery staple"
ADMIN_FIRST = "the first admin password 1"
SECRET = "w" * 48
#: What a browser sends when it opens a page.
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
BY = Caller(actor="test")
#: persona -> (team, role).
PERSONAS = {
    "fin_operator": ("finance", Role.OPERATOR),
    "fin_viewer": ("finance", Role.VIEWER),
    "ops_viewer": ("ops", Role.VIEWER),
    "chief": (ALL_TEAMS, Role.ADMIN),
}
BROKEN_FILE = "/dags/broken_feed.py"
BROKEN = (
    "SyntaxError: invalid syntax",
    'Traceback (most recent call last):\n  File "/dags/broken_feed.py"\nSyntaxError',
)


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """argon2 at its smallest cost in this process (the tests sign in many times)."""
    from argon2 import PasswordHasher

    cheap = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    monkeypatch.setattr(accounts, "_hasher", lambda: cheap)


@dataclass
class Web:
    """An app over a database with the test DAGs, and the runner that executes web_pipeline."""

    db: Database
    runner: DagRunner
    marker: Path

    def client(self) -> TestClient:
        """A new browser-like client (its own cookies, asking for HTML), not following redirects."""
        app = create_app(self.db, ApiSettings(), secret_key=SECRET, logs_dir=self.runner.files.logs_dir)
        return TestClient(app, follow_redirects=False, headers={"Accept": BROWSER_ACCEPT})


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def web_db_url(request: pytest.FixtureRequest) -> str:
    """SQLite and PostgreSQL (the pages' reads are dialect-free; the store suite covers MariaDB)."""
    url: str = request.getfixturevalue({"sqlite": "sqlite_url", "postgresql": "pg_url"}[request.param])
    return url


@pytest.fixture
def web(web_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Web]:
    """Personas, the bootstrap admin (with its first password), two DAGs and a load error."""
    marker = tmp_path / "feed-is-back"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    runner = DagRunner(web_pipeline, database_url=web_db_url)
    db = runner.db
    sync_dags(
        db, structures=[ops_cleanup.structure()], scanned_files=[BROKEN_FILE], errors={BROKEN_FILE: BROKEN}
    )
    for team in ("finance", "ops"):
        accounts.create_team(db, team, by=BY)
    accounts.bootstrap_admin(db, password=ADMIN_FIRST)
    for name, (team, role) in PERSONAS.items():
        accounts.create_user(db, name, PASSWORD, team=team, role=role, by=BY)
    yield Web(db=db, runner=runner, marker=marker)
    runner.close()


def csrf_of(html: str) -> str:
    """The CSRF token the page's forms carry."""
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def sign_in(client: TestClient, username: str, password: str = PASSWORD) -> str:
    """Sign in through the login form; the CSRF token of the session."""
    response = client.post("/login", data={"username": username, "password": password, "next": "/"})
    assert response.status_code == 303, response.text
    page = client.get("/password" if response.headers["location"] == "/password" else "/")
    assert page.status_code == 200
    return csrf_of(page.text)
