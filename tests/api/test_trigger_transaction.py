"""A trigger over HTTP: its change and its call's audit entry in one transaction, each call
recorded once whatever its outcome; token principals cached briefly, revocation still effective."""

from __future__ import annotations

import time
import warnings

import pytest

from tests.api.conftest import SECRET, Api
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.admission import AdmissionLimits
from treadle.engine import accounts
from treadle.store.database import Database

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
PATH = "/api/v1/dags/fin_report/runs"


def _calls(api: Api, path: str) -> list[int]:
    """The statuses of the `api.request` entries of `path`, oldest first."""
    entries = accounts.list_audit(api.db, action="api.request", limit=1000)
    return [e.details["status"] for e in reversed(entries) if e.target == path]


def test_each_trigger_call_is_audited_once_and_a_made_run_with_its_change(api: Api) -> None:
    app = create_app(api.db, ApiSettings(), secret_key=SECRET, admission=AdmissionLimits(per_dag=2))
    with TestClient(app) as client:
        h = api.as_("fin_operator")
        made = client.post(PATH, json={}, headers=h)
        assert made.status_code == 201, made.text
        keyed = {**h, "Idempotency-Key": "k-1"}
        first = client.post(PATH, json={}, headers=keyed)
        assert first.status_code == 201
        again = client.post(PATH, json={}, headers=keyed)
        assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
        assert client.post(PATH, json={"conf": {"limit": 0}}, headers=h).status_code == 422
        assert client.post(PATH, json={}, headers=h).status_code == 429
        assert client.post(PATH, json={}, headers=api.as_("ops_operator")).status_code == 403
        assert client.post(PATH, json={}, headers={**h, "Idempotency-Key": "k-1"}).status_code == 201
        missing = "/api/v1/dags/no_such_dag/runs"
        assert client.post(missing, json={}, headers=h).status_code == 404
    assert _calls(api, PATH) == [201, 201, 201, 422, 429, 403, 201]
    assert _calls(api, missing) == [404]
    # The run's trigger entry and its call's entry come from one transaction: one clock reading.
    run_id = made.json()["run_id"]
    [trigger] = [
        e for e in accounts.list_audit(api.db, action="run.trigger", limit=100) if e.target == run_id
    ]
    calls = [e for e in accounts.list_audit(api.db, action="api.request", limit=100) if e.target == PATH]
    assert trigger.at in {e.at for e in calls}


def test_a_token_revoked_by_another_process_is_refused_within_the_cache_time(
    api: Api, api_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shorter cache time than the 5 s default, which the loop below would wait out.
    monkeypatch.setattr(accounts, "TOKEN_CACHE_S", 0.5)
    headers = api.as_("fin_viewer")
    assert api.client.get("/api/v1/dags", headers=headers).status_code == 200
    other = Database(api_db_url)  # another process's: this API's cache hears nothing of it
    try:
        [token] = accounts.list_tokens(other, username="fin_viewer")
        accounts.revoke_token(other, token.id, by=accounts.Caller(actor="test"))
        deadline = time.monotonic() + accounts.TOKEN_CACHE_S + 60
        status = 200
        while status == 200 and time.monotonic() < deadline:
            time.sleep(0.05)  # a poll, not a request loop that keeps a core busy
            status = api.client.get("/api/v1/dags", headers=headers).status_code
        assert status == 401
    finally:
        other.dispose()


def test_an_account_change_in_this_process_takes_effect_at_once(api: Api) -> None:
    headers = api.as_("fin_operator")
    assert api.client.get("/api/v1/dags", headers=headers).status_code == 200
    accounts.set_active(api.db, "fin_operator", active=False, by=accounts.Caller(actor="test"))
    assert api.client.get("/api/v1/dags", headers=headers).status_code == 401
    accounts.set_active(api.db, "fin_operator", active=True, by=accounts.Caller(actor="test"))
    assert api.client.get("/api/v1/dags", headers=headers).status_code == 200
