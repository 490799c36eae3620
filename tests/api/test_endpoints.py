"""Endpoints call the engine: triggers, params violations, runs paging, dead letters, audit."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, make_client
from tests.api.dags_for_api import fin_broken
from treadle.engine import accounts
from treadle.testing import DagRunner

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_trigger_with_bad_params_lists_every_violation_and_creates_nothing(api: Api) -> None:
    response = api.client.post(
        "/api/v1/dags/fin_report/runs",
        json={"conf": {"limit": 0, "extra": 1}},
        headers=api.as_("fin_operator"),
    )
    assert response.status_code == 422
    body = response.json()
    assert response.headers["content-type"] == "application/problem+json"
    assert {e["field"] for e in body["errors"]} == {"conf.limit", "conf.extra"}
    assert api.client.get("/api/v1/runs", headers=api.as_("admin")).json()["runs"] == []


def test_unknown_fields_and_bad_values_are_422_naming_the_field(api: Api) -> None:
    h = api.as_("fin_operator")
    extra = api.client.post("/api/v1/dags/fin_report/runs", json={"conf": {}, "state": "success"}, headers=h)
    assert extra.status_code == 422 and extra.json()["errors"][0]["field"] == "body.state"
    bad = api.client.get("/api/v1/runs?state=exploded", headers=h)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "query.state"
    assert api.client.get("/api/v1/runs?limit=100000", headers=h).status_code == 400
    assert api.client.get("/api/v1/runs?cursor=notacursor", headers=h).status_code == 400
    assert api.client.get("/api/v1/runs/nope", headers=h).status_code == 404


def test_request_body_size_is_limited(api: Api) -> None:
    client = make_client(api.db, max_body_bytes=2048)
    big = {"conf": {"blob": "x" * 4096}}
    response = client.post("/api/v1/dags/fin_report/runs", json=big, headers=api.as_("fin_operator"))
    assert response.status_code == 413
    assert response.json()["title"] == "Request body too large"
    client.close()


def test_runs_are_paged_with_a_cursor(api: Api) -> None:
    h = api.as_("fin_operator")
    made = [
        api.client.post("/api/v1/dags/fin_report/runs", json={}, headers=h).json()["run_id"] for _ in range(5)
    ]
    seen: list[str] = []
    cursor = None
    while True:
        page = api.client.get(
            "/api/v1/runs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}, headers=h
        )
        body = page.json()
        seen += [r["run_id"] for r in body["runs"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made) and len(seen) == 5
    detail = api.client.get(f"/api/v1/runs/{made[0]}", headers=h).json()
    assert detail["run"]["dag_id"] == "fin_report" and detail["task_instances"][0]["task_id"] == "step"
    why = api.client.get(f"/api/v1/runs/{made[0]}/why", headers=h).json()
    assert why and why[0]["task_id"] == "step"
    task = api.client.get(f"/api/v1/runs/{made[0]}/tasks/step", headers=h)
    assert task.status_code == 200


def test_dag_detail_has_structure_schedule_and_next_fires(api: Api) -> None:
    body = api.client.get("/api/v1/dags/ops_daily", headers=api.as_("admin")).json()
    assert body["dag"]["team"] == "default"
    assert "step" in body["structure"]["tasks"]
    assert len(body["schedule"]["next_fires"]) == 5 and body["schedule"]["next_fires"][0].endswith(
        "02:00:00Z"
    )
    fin = api.client.get("/api/v1/dags/fin_report", headers=api.as_("fin_viewer")).json()
    assert fin["structure"]["team"] == "finance" and fin["schedule"] is None


def test_dead_letters_are_listed_grouped_and_requeued_with_an_audit_entry(api: Api, api_db_url: str) -> None:
    runner = DagRunner(fin_broken, database_url=api_db_url)
    run_id = runner.trigger()
    runner.run_until_done(run_id)
    runner.close()
    h = api.as_("fin_operator")
    letters = api.client.get("/api/v1/dead-letters", headers=h).json()
    assert [d["task_instance"]["run_id"] for d in letters] == [run_id]
    assert api.client.get("/api/v1/dead-letters", headers=api.as_("ops_operator")).json() == []
    groups = api.client.get("/api/v1/dead-letters/groups", headers=h).json()
    assert groups[0]["count"] == 1
    ti = letters[0]["task_instance"]["id"]
    assert (
        api.client.post(f"/api/v1/dead-letters/{ti}/requeue", headers=api.as_("ops_operator")).status_code
        == 403
    )
    requeued = api.client.post(f"/api/v1/dead-letters/{ti}/requeue", headers=h)
    assert requeued.status_code == 200 and requeued.json()["state"] == "queued"
    entry = accounts.list_audit(api.db, action="dead_letter.requeue")[0]
    assert entry.actor.startswith("token:") and entry.actor.endswith(":fin_operator")
    assert entry.address == "testclient" and entry.target == f"{run_id}/broken"


def test_every_mutation_is_audited_with_who_where_and_redacted_parameters(api: Api) -> None:
    h = api.as_("admin")
    calls = [
        ("POST", "/api/v1/dags/fin_report/runs", {"conf": {"limit": 3}}),
        ("POST", "/api/v1/dags/fin_report/pause", None),
        ("POST", "/api/v1/dags/fin_report/unpause", None),
        ("PUT", "/api/v1/pools/etl", {"slots": 2}),
        ("DELETE", "/api/v1/pools/etl", None),
        ("POST", "/api/v1/teams", {"name": "data"}),
        ("POST", "/api/v1/users", {"username": "carol", "password": "carols password!"}),
        ("PUT", "/api/v1/users/carol/roles/data", {"role": "operator"}),
        ("DELETE", "/api/v1/users/carol/roles/data", None),
        ("POST", "/api/v1/users/carol/disable", None),
        ("POST", "/api/v1/users/carol/enable", None),
    ]
    for method, path, body in calls:
        response = api.client.request(method, path, json=body, headers=h)
        assert response.status_code < 300, (path, response.text)
    run_id = accounts.list_audit(api.db, action="run.trigger")[0].target
    for path in (f"/api/v1/runs/{run_id}/cancel", f"/api/v1/runs/{run_id}/clear"):
        assert api.client.post(path, json={"reason": "test"}, headers=h).status_code == 200
        calls.append(("POST", path, None))
    requests = accounts.list_audit(api.db, action="api.request", limit=500)
    assert sorted((e.details["method"], e.target) for e in requests) == sorted((m, p) for m, p, _ in calls)
    assert {e.address for e in requests} == {"testclient"}
    assert all(e.actor.endswith(":admin") for e in requests)
    made = next(e for e in requests if e.target == "/api/v1/users")
    assert made.details["body"]["password"] == "***" and "carols password!" not in str(requests)
    changes = {e.action for e in accounts.list_audit(api.db, limit=500)}
    assert {
        "run.trigger",
        "dag.pause",
        "dag.unpause",
        "team.create",
        "user.create",
        "user.set_role",
    } <= changes
    assert {
        "user.disable",
        "user.enable",
        "run.cancelled",
        "task.clear",
        "pool.created",
        "pool.deleted",
    } <= changes
    listed = api.client.get("/api/v1/audit", params={"action": "run.trigger"}, headers=h).json()
    assert [e["target"] for e in listed["entries"]] == [run_id]


def test_openapi_document_and_docs_are_served_without_credentials(api: Api) -> None:
    doc = api.client.get("/api/v1/openapi.json").json()
    paths = set(doc["paths"])
    assert {"/healthz", "/readyz"} <= paths
    assert all(p.startswith("/api/v1/") for p in paths - {"/healthz", "/readyz"})
    assert doc["components"]["schemas"]["TriggerRequest"]["additionalProperties"] is False
    docs = api.client.get("/api/v1/docs")
    assert (
        docs.status_code == 200
        and "script-src https://cdn.jsdelivr.net 'sha256-" in docs.headers["content-security-policy"]
    )
