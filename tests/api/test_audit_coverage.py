"""Every mutating route leaves an audit entry, whatever its outcome; the CLI's changes are audited too."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from fastapi.routing import APIRoute

from tests.api.conftest import Api
from treadle.api.guard import EXEMPT
from treadle.cli import backfills as _backfills  # noqa: F401  (registers `treadle backfill`)
from treadle.cli import dags as _dags  # noqa: F401  (registers `treadle dags`)
from treadle.cli.main import cli
from treadle.engine import accounts

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _mutating_routes(api: Api) -> list[tuple[str, str]]:
    # An id nothing has in every path parameter: no call changes the admin's own account or token.
    return [
        (method, re.sub(r"\{[^}]+\}", "999999", route.path))
        for route in api.client.app.routes  # type: ignore[attr-defined]
        if isinstance(route, APIRoute) and route.path not in EXEMPT
        for method in sorted(route.methods & MUTATING)
    ]


def test_every_mutating_route_records_the_request_in_the_audit_log(api: Api) -> None:
    routes = _mutating_routes(api)
    assert len(routes) >= 20
    for method, path in routes:
        response = api.client.request(method, path, json={}, headers=api.as_("admin"))
        assert response.status_code != 401, (method, path)
    requests = accounts.list_audit(api.db, action="api.request", limit=1000)
    recorded = {(e.details["method"], e.target) for e in requests}
    missing = [r for r in routes if r not in recorded]
    assert missing == [], missing
    assert all(e.actor.endswith(":admin") for e in requests)


def test_cli_changes_are_audited_as_the_os_user(api: Api, api_db_url: str, tmp_path: object) -> None:
    env = {"TREADLE_DATABASE_URL": api_db_url, "TREADLE_HOME": str(tmp_path)}
    runner = CliRunner()
    for args in (["dags", "trigger", "fin_report"], ["dags", "pause", "ops_daily"]):
        result = runner.invoke(cli, args, env=env)
        assert result.exit_code == 0, result.output
    entries = {e.action: e for e in accounts.list_audit(api.db, limit=100) if e.actor.startswith("cli:")}
    assert {"run.trigger", "dag.pause"} <= set(entries)
