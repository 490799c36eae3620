"""Sign-in, sessions, CSRF, the password-change gate, tokens, throttling."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.api.conftest import BY, PASSWORD, Api, login, make_client
from treadle.domain.access import Role
from treadle.engine import accounts
from treadle.store.database import db_now

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_bootstrap_admin_must_change_its_password_before_anything_else(api_db_url: str) -> None:
    from treadle.store.database import Database

    db = Database(api_db_url)
    first = accounts.bootstrap_admin(db, password=None)
    assert first is not None and len(first) >= 20
    assert accounts.bootstrap_admin(db, password="another password entirely") is None
    client = make_client(db)
    csrf = login(client, "admin", first)
    refused = client.get("/api/v1/dags")
    assert refused.status_code == 403
    assert refused.json()["password_change"] == "/api/v1/auth/password"
    assert client.get("/api/v1/auth/me").json()["must_change_password"] is True
    changed = client.post(
        "/api/v1/auth/password",
        json={"current_password": first, "new_password": "a brand new password"},
        headers={"X-CSRF-Token": csrf},
    )
    assert changed.status_code == 200, changed.text
    assert client.get("/api/v1/dags").status_code == 200
    # A restart never resets a changed password.
    assert accounts.bootstrap_admin(db, password="yet another password") is None
    assert not accounts.has_unchanged_bootstrap_password(db)
    assert (
        make_client(db)
        .post("/api/v1/auth/login", json={"username": "admin", "password": "a brand new password"})
        .status_code
        == 200
    )
    client.close()
    db.dispose()


def test_session_cookie_flags_and_csrf(api: Api) -> None:
    response = api.client.post("/api/v1/auth/login", json={"username": "fin_operator", "password": PASSWORD})
    cookies = response.headers.get_list("set-cookie")
    session = next(c for c in cookies if c.startswith("treadle_session="))
    assert "HttpOnly" in session and "SameSite=lax" in session and "Path=/;" in session
    assert "Secure" not in session  # plain http, not behind TLS
    csrf = response.json()["csrf_token"]
    no_header = api.client.post("/api/v1/dags/fin_report/pause")
    assert no_header.status_code == 403 and no_header.json()["title"] == "CSRF check failed"
    wrong = api.client.post("/api/v1/dags/fin_report/pause", headers={"X-CSRF-Token": "x" + csrf})
    assert wrong.status_code == 403
    assert api.client.get("/api/v1/dags/fin_report").json()["dag"]["is_paused"] is False
    ok = api.client.post("/api/v1/dags/fin_report/pause", headers={"X-CSRF-Token": csrf})
    assert ok.status_code == 200 and ok.json()["is_paused"] is True


def test_secure_cookie_behind_tls(api: Api) -> None:
    client = make_client(api.db, behind_tls=True)
    response = client.post("/api/v1/auth/login", json={"username": "fin_viewer", "password": PASSWORD})
    assert all("Secure" in c for c in response.headers.get_list("set-cookie"))
    client.close()


def test_password_change_ends_other_sessions_and_rotates_this_one(api: Api) -> None:
    other = make_client(api.db)
    login(other, "fin_viewer")
    csrf = login(api.client, "fin_viewer")
    assert other.get("/api/v1/dags").status_code == 200
    changed = api.client.post(
        "/api/v1/auth/password",
        json={"current_password": PASSWORD, "new_password": "the second password"},
        headers={"X-CSRF-Token": csrf},
    )
    assert changed.status_code == 200
    assert other.get("/api/v1/dags").status_code == 401
    assert api.client.get("/api/v1/dags").status_code == 200
    other.close()


def test_a_role_change_or_disabling_ends_sessions_and_tokens(api: Api) -> None:
    login(api.client, "fin_operator")
    assert api.client.get("/api/v1/dags").status_code == 200
    accounts.set_role(api.db, "fin_operator", team="finance", role=Role.VIEWER, by=BY)
    assert api.client.get("/api/v1/dags").status_code == 401
    assert api.client.get("/api/v1/dags", headers=api.as_("fin_viewer")).status_code == 200
    accounts.set_active(api.db, "fin_viewer", active=False, by=BY)
    assert api.client.get("/api/v1/dags", headers=api.as_("fin_viewer")).status_code == 401


def test_wrong_password_disabled_user_and_logout(api: Api) -> None:
    assert (
        api.client.post("/api/v1/auth/login", json={"username": "fin_viewer", "password": "nope"}).status_code
        == 401
    )
    assert (
        api.client.post("/api/v1/auth/login", json={"username": "ghost", "password": "nope"}).status_code
        == 401
    )
    csrf = login(api.client, "fin_viewer")
    assert api.client.post("/api/v1/auth/logout", headers={"X-CSRF-Token": csrf}).status_code == 204
    assert api.client.get("/api/v1/dags").status_code == 401


def test_login_is_rate_limited_per_user_and_per_address(api: Api) -> None:
    for _ in range(3):
        bad = api.client.post("/api/v1/auth/login", json={"username": "fin_viewer", "password": "wrong"})
        assert bad.status_code == 401
    throttled = api.client.post("/api/v1/auth/login", json={"username": "fin_viewer", "password": PASSWORD})
    assert throttled.status_code == 429
    assert throttled.headers["Retry-After"] == "60"
    # Another user from the same address still gets in until the address budget (6) is spent.
    login(make_client(api.db), "fin_operator")
    for _ in range(3):
        api.client.post("/api/v1/auth/login", json={"username": "ops_operator", "password": "wrong"})
    assert (
        api.client.post("/api/v1/auth/login", json={"username": "admin", "password": PASSWORD}).status_code
        == 429
    )
    failures = accounts.list_audit(api.db, action="auth.login_failed")
    assert len(failures) == 6 and {e.address for e in failures} == {"testclient"}
    assert len(accounts.list_audit(api.db, action="auth.login_throttled")) == 2


def test_tokens_are_shown_once_and_can_be_revoked_or_expire(api: Api) -> None:
    csrf = login(api.client, "fin_operator")
    made = api.client.post(
        "/api/v1/tokens",
        json={"name": "ci", "team": "finance", "role": "operator"},
        headers={"X-CSRF-Token": csrf},
    )
    assert made.status_code == 201, made.text
    secret, token_id = made.json()["token"], made.json()["id"]
    listed = api.client.get("/api/v1/tokens").json()
    assert {t["name"] for t in listed} == {"fin_operator-t", "ci"} and all("token" not in t for t in listed)
    headers = {"Authorization": f"Bearer {secret}"}
    assert api.client.get("/api/v1/dags", headers=headers).status_code == 200
    too_strong = api.client.post(
        "/api/v1/tokens",
        json={"name": "x", "team": "finance", "role": "admin"},
        headers={"X-CSRF-Token": csrf},
    )
    assert too_strong.status_code == 403
    assert api.client.post("/api/v1/tokens", json={"name": "y"}, headers=headers).status_code == 403
    assert api.client.delete(f"/api/v1/tokens/{token_id}", headers={"X-CSRF-Token": csrf}).status_code == 204
    assert api.client.get("/api/v1/dags", headers=headers).status_code == 401
    # Another user's token is not the caller's to revoke.
    others = accounts.list_tokens(api.db, username="fin_viewer")[0].id
    assert api.client.delete(f"/api/v1/tokens/{others}", headers={"X-CSRF-Token": csrf}).status_code == 404

    short, _ = accounts.create_token(
        api.db,
        "fin_viewer",
        name="short",
        team="finance",
        role=Role.VIEWER,
        expires_in=timedelta(seconds=1),
        by=BY,
    )
    bearer = {"Authorization": f"Bearer {short}"}
    expired_at = api.db.query(db_now) + timedelta(seconds=1)
    while api.db.query(db_now) <= expired_at:
        api.client.get("/healthz")
    assert api.client.get("/api/v1/dags", headers=bearer).status_code == 401


def test_malformed_credentials_are_401(api: Api) -> None:
    for header in ("Basic YWRtaW46YWRtaW4=", "Bearer", "Bearer trd_unknown", "bearer  "):
        assert api.client.get("/api/v1/dags", headers={"Authorization": header}).status_code == 401, header
    api.client.cookies.set("treadle_session", "forged.value.sig", path="/api/v1")
    assert api.client.get("/api/v1/dags").status_code == 401
