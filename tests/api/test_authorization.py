"""Deny by default: every route needs credentials and a permission; roles apply per team."""

from __future__ import annotations

import re

import pytest
from fastapi.routing import APIRoute

from tests.api.conftest import Api
from treadle.api.deps import action_of
from treadle.api.guard import EXEMPT
from treadle.domain.access import Scope

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _routes(api: Api) -> list[tuple[str, str, APIRoute]]:
    found = []
    for route in api.client.app.routes:  # type: ignore[attr-defined]
        if isinstance(route, APIRoute):
            for method in sorted(route.methods - {"HEAD"}):
                path = re.sub(r"\{[^}]+\}", "1", route.path)
                found.append((method, path, route))
    return found


def _action(route: APIRoute):
    actions = [action_of(d.call) for d in route.dependant.dependencies if d.call is not None]
    return next((a for a in actions if a is not None), None)


def test_every_route_but_the_exempt_ones_answers_401_without_credentials(api: Api) -> None:
    routes = _routes(api)
    assert len(routes) > 30
    for method, path, route in routes:
        response = api.client.request(method, path, json={})
        if route.path in EXEMPT:
            assert response.status_code != 401, (method, path)
        else:
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert response.headers["www-authenticate"] == "Bearer"


def test_unknown_paths_and_lookalikes_of_exempt_paths_need_credentials(api: Api) -> None:
    for path in ("/api/v1/nothing", "/api/v1/dags/healthz", "/readyz/", "/api/v1/auth/login/x", "/healthz2"):
        assert api.client.get(path).status_code == 401, path


def test_every_route_declares_exactly_one_permission(api: Api) -> None:
    for method, _path, route in _routes(api):
        if route.path in EXEMPT:
            continue
        assert _action(route) is not None, f"{method} {route.path} declares no permission"


def test_a_token_without_grants_is_refused_everywhere_but_its_own_account(api: Api) -> None:
    for method, path, route in _routes(api):
        if route.path in EXEMPT:
            continue
        action = _action(route)
        response = api.client.request(method, path, json={}, headers=api.as_("nobody"))
        if action.scope is Scope.SELF:
            assert response.status_code != 403 or "token cannot" in response.text, (method, path)
        else:
            assert response.status_code == 403, (method, path, response.text)


@pytest.mark.parametrize(
    ("method", "path", "body", "allowed"),
    [
        ("post", "/api/v1/dags/fin_report/runs", {"conf": {}}, {"admin", "fin_operator"}),
        ("post", "/api/v1/dags/fin_report/pause", None, {"admin", "fin_operator"}),
        ("post", "/api/v1/dags/fin_report/unpause", None, {"admin", "fin_operator"}),
        ("post", "/api/v1/dags/ops_daily/pause", None, {"admin"}),
        ("put", "/api/v1/pools/etl", {"slots": 3}, {"admin"}),
        ("post", "/api/v1/teams", {"name": "t{n}"}, {"admin"}),
        ("post", "/api/v1/users", {"username": "u{n}", "password": "long enough password"}, {"admin"}),
    ],
)
def test_role_and_team_matrix_for_mutations(
    api: Api, method: str, path: str, body: object, allowed: set[str]
) -> None:
    for n, who in enumerate(("admin", "fin_operator", "fin_viewer", "ops_operator", "nobody")):
        payload = (
            {k: v.format(n=n) if isinstance(v, str) else v for k, v in body.items()}
            if isinstance(body, dict)
            else body
        )
        response = api.client.request(method.upper(), path, json=payload, headers=api.as_(who))
        expected = "allowed" if who in allowed else "denied"
        got = "denied" if response.status_code == 403 else "allowed"
        assert got == expected, (who, response.status_code, response.text)
        if got == "allowed":
            assert response.status_code < 300, (who, response.text)


def test_run_actions_follow_the_team_of_the_runs_dag(api: Api) -> None:
    run_id = api.client.post("/api/v1/dags/fin_report/runs", json={}, headers=api.as_("fin_operator")).json()[
        "run_id"
    ]
    for who, status in (("ops_operator", 403), ("fin_viewer", 403), ("fin_operator", 200)):
        response = api.client.post(
            f"/api/v1/runs/{run_id}/cancel", json={"reason": "x"}, headers=api.as_(who)
        )
        assert response.status_code == status, (who, response.text)
    assert api.client.get(f"/api/v1/runs/{run_id}", headers=api.as_("ops_operator")).status_code == 403
    assert api.client.get(f"/api/v1/runs/{run_id}", headers=api.as_("fin_viewer")).status_code == 200
    cleared = api.client.post(f"/api/v1/runs/{run_id}/clear", json={}, headers=api.as_("ops_operator"))
    assert cleared.status_code == 403


def test_lists_show_only_the_callers_teams(api: Api) -> None:
    api.client.post("/api/v1/dags/fin_report/runs", json={}, headers=api.as_("admin"))
    api.client.post("/api/v1/dags/ops_daily/runs", json={}, headers=api.as_("admin"))
    dags = {d["dag_id"] for d in api.client.get("/api/v1/dags", headers=api.as_("fin_viewer")).json()}
    assert dags == {"fin_report", "fin_broken"}
    runs = api.client.get("/api/v1/runs", headers=api.as_("fin_viewer")).json()["runs"]
    assert {r["dag_id"] for r in runs} == {"fin_report"}
    everything = api.client.get("/api/v1/runs", headers=api.as_("admin")).json()["runs"]
    assert {r["dag_id"] for r in everything} == {"fin_report", "ops_daily"}
    assert api.client.get("/api/v1/runs", headers=api.as_("ops_operator")).json()["runs"] == []


def test_the_audit_log_and_load_errors_are_for_admins_of_every_team(api: Api) -> None:
    for who in ("fin_operator", "fin_viewer", "ops_operator"):
        assert api.client.get("/api/v1/audit", headers=api.as_(who)).status_code == 403
        assert api.client.get("/api/v1/dag-load-errors", headers=api.as_(who)).status_code == 403
    assert (
        api.client.get("/api/v1/dag-load-errors", headers=api.as_("admin")).json()[0]["fileloc"]
        == "/dags/bad.py"
    )


def test_a_token_never_exceeds_its_users_current_role(api: Api) -> None:
    from treadle.domain.access import Role
    from treadle.engine import accounts
    from treadle.engine.accounts import Caller

    accounts.set_role(api.db, "fin_operator", team="finance", role=Role.VIEWER, by=Caller(actor="test"))
    response = api.client.post("/api/v1/dags/fin_report/runs", json={}, headers=api.as_("fin_operator"))
    assert response.status_code == 403
    assert api.client.get("/api/v1/dags/fin_report", headers=api.as_("fin_operator")).status_code == 200
