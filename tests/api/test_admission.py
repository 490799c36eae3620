"""Admission control over HTTP and the CLI: 429 with Retry-After naming the limit, exit 75."""

from __future__ import annotations

import warnings

import pytest
from click.testing import CliRunner

from tests.api.conftest import SECRET, Api
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.cli import dags as _dags  # noqa: F401  (registers `treadle dags`)
from treadle.cli.main import cli
from treadle.domain.admission import PER_DAG_SETTING, PER_QUEUE_SETTING, AdmissionLimits
from treadle.engine import accounts
from treadle.engine.admission import REFUSED_ACTION

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_a_trigger_past_a_limit_is_429_with_retry_after_and_nothing_created(api: Api) -> None:
    app = create_app(api.db, ApiSettings(), secret_key=SECRET, admission=AdmissionLimits(per_dag=1))
    with TestClient(app) as client:
        h = api.as_("fin_operator")
        assert client.post("/api/v1/dags/fin_report/runs", json={}, headers=h).status_code == 201
        refused = client.post("/api/v1/dags/fin_report/runs", json={}, headers=h)
        assert refused.status_code == 429
        assert refused.headers["content-type"] == "application/problem+json"
        assert int(refused.headers["Retry-After"]) > 0
        body = refused.json()
        assert body["title"] == "Overloaded" and PER_DAG_SETTING in body["detail"]
        assert body["limit"] == {
            "setting": PER_DAG_SETTING,
            "value": 1,
            "scope": "dag",
            "name": "fin_report",
            "queued": 1,
            "adding": 1,
        }
        runs = client.get("/api/v1/runs", headers=api.as_("admin")).json()["runs"]
        assert len(runs) == 1
    [entry] = accounts.list_audit(api.db, action=REFUSED_ACTION, limit=10)
    assert entry.actor.endswith(":fin_operator") and entry.details["kind"] == "trigger"
    assert entry.address is not None


def test_the_cli_trigger_past_a_limit_exits_75_with_the_same_message(
    api: Api, api_db_url: str, tmp_path: object
) -> None:
    env = {
        "TREADLE_DATABASE_URL": api_db_url,
        "TREADLE_HOME": str(tmp_path),
        "TREADLE_MAX_QUEUED_PER_QUEUE": "1",
    }
    runner = CliRunner()
    first = runner.invoke(cli, ["dags", "trigger", "fin_report"], env=env)
    assert first.exit_code == 0, first.output
    second = runner.invoke(cli, ["dags", "trigger", "fin_report"], env=env)
    assert second.exit_code == 75
    assert "overloaded" in second.output and f"{PER_QUEUE_SETTING} is 1" in second.output
    [entry] = accounts.list_audit(api.db, action=REFUSED_ACTION, limit=10)
    assert entry.actor.startswith("cli:")
    assert len(accounts.list_audit(api.db, action="run.trigger", limit=10)) == 1
