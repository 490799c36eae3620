"""The web UI over a real SQLite file: served by uvicorn in a thread, DAGs run in-process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from tests.api.dags_for_api import fin_report, ops_daily
from tests.web.dags_for_web import MARKER_ENV, web_pipeline
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.access import Role
from treadle.engine import accounts
from treadle.engine.accounts import Caller
from treadle.engine.dags import sync_dags
from treadle.testing import DagRunner

PASSWORD = "correct horse battery staple"
ADMIN_FIRST_PASSWORD = "first admin password 0"
SECRET = "w" * 48
BY = Caller(actor="test")
#: persona -> (team, role).
PERSONAS = {
    "fin_operator": ("finance", Role.OPERATOR),
    "fin_viewer": ("finance", Role.VIEWER),
    "ops_viewer": ("ops", Role.VIEWER),
}
LOAD_ERROR = ("/dags/broken_feed.py", ("SyntaxError: invalid syntax (broken_feed.py, line 3)", "Traceback (most recent call last):\n  File \"/dags/broken_feed.py\", line 3\n    def broken(:\n               ^\nSyntaxError: invalid syntax"))


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """argon2 at its smallest cost (the tests sign in many times on a busy machine)."""
    from argon2 import PasswordHasher

    monkeypatch.setattr(accounts, "_hasher", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


@dataclass
class Site:
    """A served web UI: its base URL, the DAG runner on its database, the marker file."""

    url: str
    runner: DagRunner
    marker: Path

    def run_to_end(self, run_id: str) -> str:
        """Drive a run to its end in this process; its final state."""
        return self.runner.run_until_done(run_id, timeout_s=60).state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    """The app on a fresh SQLite file with the bootstrap admin, personas, DAGs and a load error."""
    marker = tmp_path / "feed-is-back"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    runner = DagRunner(web_pipeline, database_url=f"sqlite:///{tmp_path / 'treadle.db'}")
    db = runner.db
    sync_dags(
        db,
        structures=[fin_report.structure(), ops_daily.structure()],
        scanned_files=[LOAD_ERROR[0]],
        errors=dict([LOAD_ERROR]),
    )
    for team in ("finance", "ops"):
        accounts.create_team(db, team, by=BY)
    accounts.bootstrap_admin(db, password=ADMIN_FIRST_PASSWORD)
    for name, (team, role) in PERSONAS.items():
        accounts.create_user(db, name, PASSWORD, team=team, role=role, by=BY)
    app = create_app(db, ApiSettings(), secret_key=SECRET, logs_dir=runner.files.logs_dir)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="web-ui-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test web server did not start within 30 s")
        time.sleep(0.02)
    try:
        yield Site(url=f"http://127.0.0.1:{port}", runner=runner, marker=marker)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        runner.close()
