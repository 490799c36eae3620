"""Dataset ownership over HTTP: owner, grant, revoke and the access list, admins of `*` only."""

from __future__ import annotations

import pytest

from tests.api.conftest import PERSONAS, Api
from treadle.engine import accounts

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
OWNER = "/api/v1/dataset-access/owner"
GRANT = "/api/v1/dataset-access/grant"
REVOKE = "/api/v1/dataset-access/revoke"
ACCESS = "/api/v1/dataset-access"


def test_an_admin_sets_the_owner_grants_and_revokes_with_audit_entries(api: Api) -> None:
    h = api.as_("admin")
    uri = "s3://lake/orders?v=1"
    made = api.client.put(OWNER, json={"dataset": uri, "team": "finance"}, headers=h)
    assert made.status_code == 200, made.text
    assert made.json() == {"dataset": uri, "owner": "finance", "previous": None}
    moved = api.client.put(OWNER, json={"dataset": uri, "team": "ops"}, headers=h).json()
    assert moved["previous"] == "finance" and moved["owner"] == "ops"
    granted = api.client.post(GRANT, json={"dataset": uri, "team": "finance"}, headers=h).json()
    assert granted == {"dataset": uri, "team": "finance", "changed": True}
    assert (
        api.client.post(GRANT, json={"dataset": uri, "team": "finance"}, headers=h).json()["changed"] is False
    )
    listed = api.client.get(ACCESS, headers=api.as_("fin_viewer")).json()
    assert listed == [{"dataset": uri, "owner": "ops", "granted": ["finance"]}]
    revoked = api.client.post(REVOKE, json={"dataset": uri, "team": "finance"}, headers=h).json()
    assert revoked["changed"] is True
    assert (
        api.client.post(REVOKE, json={"dataset": uri, "team": "finance"}, headers=h).json()["changed"]
        is False
    )
    assert api.client.get(ACCESS, headers=h).json() == [{"dataset": uri, "owner": "ops", "granted": []}]
    entries = [e for e in accounts.list_audit(api.db, limit=50) if e.target == f"dataset:{uri}"]
    assert [e.action for e in entries] == [
        "dataset.revoke",
        "dataset.grant",
        "dataset.set_owner",
        "dataset.set_owner",
    ]
    assert all(e.actor.endswith(":admin") and e.address == "testclient" for e in entries)
    requests = {e.target for e in accounts.list_audit(api.db, action="api.request", limit=50)}
    assert {OWNER, GRANT, REVOKE} <= requests


def test_only_an_admin_of_every_team_changes_ownership(api: Api) -> None:
    body = {"dataset": "lake.orders", "team": "finance"}
    for who in PERSONAS:
        if who == "admin":
            continue
        for method, path in (("PUT", OWNER), ("POST", GRANT), ("POST", REVOKE)):
            response = api.client.request(method, path, json=body, headers=api.as_(who))
            assert response.status_code == 403, (who, path, response.text)
            assert "manage_datasets needs the role admin" in response.json()["detail"]
    assert api.client.get(ACCESS, headers=api.as_("admin")).json() == []
    assert api.client.get(ACCESS).status_code == 401


def test_bad_requests_are_refused_naming_the_problem(api: Api) -> None:
    h = api.as_("admin")
    unknown = api.client.put(OWNER, json={"dataset": "lake.orders", "team": "nope"}, headers=h)
    assert unknown.status_code == 404 and "no team 'nope'" in unknown.json()["detail"]
    no_owner = api.client.post(GRANT, json={"dataset": "lake.orders", "team": "finance"}, headers=h)
    assert no_owner.status_code == 400 and "no owner yet" in no_owner.json()["detail"]
    bad_name = api.client.put(OWNER, json={"dataset": "bad name", "team": "finance"}, headers=h)
    assert bad_name.status_code == 422 and bad_name.json()["errors"][0]["field"] == "body.dataset"
    extra = api.client.put(OWNER, json={"dataset": "a", "team": "finance", "owner": "x"}, headers=h)
    assert extra.status_code == 422 and "body.owner" in extra.json()["detail"]
    assert api.client.get(ACCESS, headers=h).json() == []


def test_the_openapi_document_has_the_dataset_access_operations(api: Api) -> None:
    paths = api.client.get("/api/v1/openapi.json").json()["paths"]
    assert set(paths[ACCESS]) == {"get"}
    assert set(paths[OWNER]) == {"put"}
    assert set(paths[GRANT]) == {"post"} and set(paths[REVOKE]) == {"post"}
