"""The web UI's pages and forms in-process: the guard in front of them (sign-in redirect, exact
public paths, CSRF form field, forced password change), roles and teams, the trigger form's
inline errors, the log viewer's reads, and the CSP every page keeps."""

from __future__ import annotations

import re

from tests.web.conftest import ADMIN_FIRST, PASSWORD, Web, csrf_of, sign_in
from treadle.domain.access import Role
from treadle.engine import accounts, dead_letters, pools, queries

PAGE_CSP = "script-src 'self'; style-src 'self'"


def test_pages_redirect_to_sign_in_and_the_api_still_answers_401(web: Web) -> None:
    client = web.client()
    page = client.get("/dags/web_pipeline")
    assert page.status_code == 303
    assert page.headers["location"] == "/login?next=/dags/web_pipeline"
    api = client.get("/api/v1/dags")
    assert api.status_code == 401
    assert api.headers["content-type"] == "application/problem+json"
    assert client.post("/dags/web_pipeline/pause").status_code == 401
    # A client that does not ask for HTML gets the API's answer on a page path too.
    plain = client.get("/dags/web_pipeline", headers={"Accept": "*/*"})
    assert plain.status_code == 401 and plain.headers["content-type"] == "application/problem+json"
    login = client.get("/login")
    assert login.status_code == 200 and 'name="password"' in login.text
    assert client.get("/static/app.css").status_code == 200
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    # Exact paths only: nothing else under /static is public.
    assert client.get("/static/").status_code == 303
    assert client.get("/static/app.css.map").status_code == 303
    assert client.get("/static/../api/v1/dags").status_code in (303, 401)


def test_sign_in_never_redirects_off_site(web: Web) -> None:
    client = web.client()
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        done = client.post("/login", data={"username": "chief", "password": PASSWORD, "next": target})
        assert done.headers["location"] == "/", target
    wrong = client.post("/login", data={"username": "chief", "password": "nope", "next": "/"})
    assert wrong.status_code == 200 and "wrong user name or password" in wrong.text


def test_the_bootstrap_admin_must_change_its_password_first(web: Web) -> None:
    client = web.client()
    done = client.post("/login", data={"username": "admin", "password": ADMIN_FIRST, "next": "/audit"})
    assert done.headers["location"] == "/password"
    assert client.get("/").headers["location"] == "/password"
    assert client.get("/api/v1/dags").status_code == 403
    form = client.get("/password")
    csrf = csrf_of(form.text)
    wrong = client.post(
        "/password",
        data={
            "csrf_token": csrf,
            "current_password": "nope",
            "new_password": "x" * 20,
            "confirm_password": "x" * 20,
        },
    )
    assert 'id="current_password-error"' in wrong.text and "the current password is wrong" in wrong.text
    new = "a much better admin passphrase 2"
    changed = client.post(
        "/password",
        data={
            "csrf_token": csrf,
            "current_password": ADMIN_FIRST,
            "new_password": new,
            "confirm_password": new,
        },
    )
    assert changed.status_code == 303 and changed.headers["location"] == "/"
    assert client.get("/").status_code == 200
    assert not accounts.has_unchanged_bootstrap_password(web.db)


def test_form_posts_need_the_sessions_csrf_token(web: Web) -> None:
    client = web.client()
    csrf = sign_in(client, "fin_operator")
    assert client.post("/dags/web_pipeline/pause", data={"next": "/"}).status_code == 403
    assert client.post("/dags/web_pipeline/pause", data={"csrf_token": "forged"}).status_code == 403
    assert not queries.get_dag(web.db, "web_pipeline").is_paused  # type: ignore[union-attr]
    done = client.post("/dags/web_pipeline/pause", data={"csrf_token": csrf, "next": "/"})
    assert done.status_code == 303 and done.headers["location"] == "/"
    assert queries.get_dag(web.db, "web_pipeline").is_paused  # type: ignore[union-attr]
    # The API's header still works with the same session.
    header = client.post("/api/v1/dags/web_pipeline/unpause", headers={"X-CSRF-Token": csrf})
    assert header.status_code == 200
    # The audit record of the form post names the action and leaves the token out.
    entries = accounts.list_audit(web.db, actor="user:fin_operator", action="api.request", limit=10)
    form_entry = next(
        e for e in entries if e.target == "/dags/web_pipeline/pause" and e.details["status"] == 303
    )
    assert form_entry.details["body"] == {"next": "/"}


def test_roles_and_teams_shape_every_page(web: Web) -> None:
    run_id = web.runner.trigger({"limit": 2})
    web.runner.run_until_done(run_id)
    viewer = web.client()
    csrf = sign_in(viewer, "fin_viewer")
    for path in (
        "/",
        "/dags/web_pipeline",
        f"/runs/{run_id}",
        f"/runs/{run_id}/tasks/flaky",
        "/dead-letters",
    ):
        html = viewer.get(path).text
        assert re.findall(r'<form[^>]*method="post"[^>]*action="([^"]+)"', html) == ["/logout"], path
    home = viewer.get("/").text
    assert "web_pipeline" in home and "ops_cleanup" not in home
    assert "failed to load" not in home  # load errors are for viewers of every team
    assert viewer.get("/dags/ops_cleanup").status_code == 403
    audit = viewer.get("/audit")
    assert audit.status_code == 403 and "read_audit needs the role admin" in audit.text
    assert audit.headers["content-type"].startswith("text/html")
    assert (
        viewer.get("/audit", headers={"Accept": "*/*"}).headers["content-type"] == "application/problem+json"
    )
    refused = viewer.post("/dead-letters/groups/abc/requeue", data={"csrf_token": csrf})
    assert refused.status_code in (400, 403)
    operator = web.client()
    sign_in(operator, "fin_operator")
    dag_page = operator.get("/dags/web_pipeline").text
    assert 'action="/dags/web_pipeline/trigger"' in dag_page and 'role="switch"' in dag_page
    assert 'action="/dead-letters/groups/' in operator.get("/dead-letters").text
    ops = web.client()
    sign_in(ops, "ops_viewer")
    assert "ops_cleanup" in ops.get("/").text and "web_pipeline" not in ops.get("/").text
    cleanup = ops.get("/dags/ops_cleanup").text
    assert "05:00 Europe/Berlin" in cleanup and "consecutive_failures count=2" in cleanup
    assert "flaky" not in ops.get("/dead-letters").text
    chief = web.client()
    sign_in(chief, "chief")
    assert "1 DAG file failed to load" in chief.get("/").text


def test_the_trigger_form_shows_the_servers_errors_inline(web: Web) -> None:
    client = web.client()
    csrf = sign_in(client, "fin_operator")
    low = client.post("/dags/web_pipeline/trigger", data={"csrf_token": csrf, "limit": "0"})
    assert low.status_code == 200
    error = re.search(r'<p class="field-error" id="param-limit-error">([^<]+)</p>', low.text)
    assert error and "minimum" in error.group(1)
    assert 'aria-invalid="true" aria-describedby="param-limit-error"' in low.text
    assert 'value="0"' in low.text
    word = client.post("/dags/web_pipeline/trigger", data={"csrf_token": csrf, "limit": "ten"})
    assert "not an integer: &#39;ten&#39;" in word.text
    assert queries.list_runs(web.db, dag_id="web_pipeline") == []
    good = client.post("/dags/web_pipeline/trigger", data={"csrf_token": csrf, "limit": "4"})
    assert good.status_code == 303
    (run,) = queries.list_runs(web.db, dag_id="web_pipeline")
    assert good.headers["location"] == f"/dags/web_pipeline?run={run.run_id}#grid"
    assert run.conf == {"limit": 4} and run.triggered_by == "user:fin_operator"


def test_a_dead_letter_shows_traceback_and_log_and_its_group_requeues(web: Web) -> None:
    run_id = web.runner.trigger({"limit": 1})
    assert web.runner.run_until_done(run_id).state == "failed"
    client = web.client()
    csrf = sign_in(client, "fin_operator")
    task = client.get(f"/runs/{run_id}/tasks/flaky").text
    assert "ConnectionError: the upstream feed refused the connection" in task
    log = client.get(f"/runs/{run_id}/tasks/flaky/log", params={"map_index": -1}).json()
    # In-process tasks print to this process (the browser test reads a real worker's log).
    assert log["missing"] == "" and log["attempt"] == 1 and not log["running"]
    again = client.get(
        f"/runs/{run_id}/tasks/flaky/log", params={"map_index": -1, "offset": log["offset"]}
    ).json()
    assert again["text"] == "" and again["offset"] == log["offset"] and not again["running"]
    (group,) = dead_letters.group_dead_letters(dead_letters.list_dead_letters(web.db))
    web.marker.touch()
    done = client.post(f"/dead-letters/groups/{group.fingerprint}/requeue", data={"csrf_token": csrf})
    assert done.status_code == 303
    assert web.runner.run_until_done(run_id).state == "success"
    assert "No dead letters." in client.get("/dead-letters").text


def test_needs_inspection_is_resolved_with_a_required_reason(web: Web) -> None:
    web.marker.write_text("unknown")
    run_id = web.runner.trigger({"limit": 1})
    assert web.runner.run_until_done(run_id).task_states["flaky"] == "needs_inspection"
    client = web.client()
    csrf = sign_in(client, "fin_operator")
    page = client.get("/dead-letters").text
    assert f'action="/runs/{run_id}/tasks/flaky/resolve"' in page
    assert "the feed closed the connection after the write was sent" in page
    resolve = f"/runs/{run_id}/tasks/flaky/resolve"
    no_reason = client.post(resolve, data={"csrf_token": csrf, "resolution": "success", "reason": " "})
    assert no_reason.status_code == 303 and "reason_error" in no_reason.headers["location"]
    assert "give a reason for the resolution" in client.get(no_reason.headers["location"]).text
    states = {t.task_id: t.state for t in queries.run_detail(web.db, run_id).task_instances}
    assert states["flaky"] == "needs_inspection"
    done = client.post(resolve, data={"csrf_token": csrf, "resolution": "success", "reason": "rows are in"})
    assert done.status_code == 303
    assert web.runner.run_until_done(run_id).state == "success"
    entries = accounts.list_audit(web.db, actor="user:fin_operator", limit=20)
    assert any(e.action != "api.request" and "rows are in" in str(e.details) for e in entries)


def test_every_page_keeps_a_strict_csp_without_inline_script_or_style(web: Web) -> None:
    run_id = web.runner.trigger({"limit": 2})
    web.runner.run_until_done(run_id)
    client = web.client()
    sign_in(client, "chief")
    paths = [
        "/",
        "/fragments/dags",
        "/dags/web_pipeline",
        f"/dags/web_pipeline?run={run_id}",
        "/fragments/dags/web_pipeline/grid",
        "/dags/ops_cleanup",
        f"/runs/{run_id}",
        f"/fragments/runs/{run_id}",
        f"/runs/{run_id}/tasks/square",
        f"/runs/{run_id}/tasks/square?map_index=0",
        f"/runs/{run_id}/tasks/flaky",
        "/dead-letters",
        "/operations",
        "/audit",
        "/audit?actor=user:chief&since=2020-01-01T00:00",
        "/users",
        "/tokens",
        "/pools",
        "/login",
    ]
    for path in paths:
        page = client.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        assert PAGE_CSP in page.headers["content-security-policy"], path
        html = page.text
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), path
        assert not re.search(r"\sstyle=", html), path
        assert not re.search(r"<style", html), path
        assert not re.search(r"\son[a-z]+=", html), path
    missing = client.get("/dags/nope")
    assert missing.status_code == 404 and "no DAG" in missing.text
    bad_since = client.get("/audit?since=yesterday")
    assert "since: not a date and time" in bad_since.text


def test_an_inactive_dag_says_so_and_its_trigger_is_refused(web: Web) -> None:
    from treadle.engine.dags import sync_dags

    fileloc = web.runner.dag.fileloc
    # A sync that imported the DAG's file cleanly and found no DAG in it: the file no longer defines it.
    report = sync_dags(web.db, structures=[], scanned_files=[fileloc], errors={})
    assert "web_pipeline" in {dag_id for dag_id, _ in report.deactivated}
    client = web.client()
    csrf = sign_in(client, "chief")
    listed = client.get("/")
    assert "inactive: file gone" in listed.text
    page = client.get("/dags/web_pipeline")
    assert page.status_code == 200 and "no longer defining this DAG" in page.text
    refused = client.post("/dags/web_pipeline/trigger", data={"csrf_token": csrf, "limit": "3"})
    assert refused.status_code == 200 and "inactive" in refused.text
    assert queries.list_runs(web.db, dag_id="web_pipeline") == []


def _grid_cells(html: str) -> dict[str, tuple[str, dict[str, dict[str, int]]]]:
    """Task -> (its states by run, oldest first, as the page's script reads them; mapped counts)."""
    import json
    from html import unescape

    codes = re.search(r'<table class="grid" data-codes="([^"]+)"', html)
    assert codes, "the grid carries no state codes"
    names = dict(pair.split(":", 1) for pair in codes.group(1).split(","))
    found = {}
    for task, cells, mapped in re.findall(
        r'<tr data-task="([^"]+)" data-cells="([^"]*)"(?: data-mapped="([^"]*)")?>', html
    ):
        states = ",".join(names.get(c, "none") for c in cells)
        found[task] = (states, json.loads(unescape(mapped)) if mapped else {})
    return found


def test_the_grid_sends_state_codes_and_follows_a_requeued_finished_run(web: Web) -> None:
    web.marker.touch()
    first = web.runner.trigger({"limit": 3})
    assert web.runner.run_until_done(first).state == "success"
    web.marker.unlink()
    second = web.runner.trigger({"limit": 2})
    assert web.runner.run_until_done(second).state == "failed"
    client = web.client()
    csrf = sign_in(client, "fin_operator")
    for _ in range(2):  # the second read comes from the finished runs' kept columns
        cells = _grid_cells(client.get("/fragments/dags/web_pipeline/grid").text)
        assert list(cells) == ["extract", "square", "flaky", "publish"]
        assert cells["flaky"][0] == "success,dead_letter"
        assert cells["publish"][0] == "success,upstream_failed"
        assert cells["square"] == ("success,success", {"0": {"success": 3}, "1": {"success": 3}})
    page = client.get(f"/dags/web_pipeline?run={second}").text
    assert 'aria-label="flaky: dead_letter"' in page
    assert f'href="/runs/{second}/tasks/publish" aria-label="publish: upstream_failed"' in page
    (group,) = dead_letters.group_dead_letters(dead_letters.list_dead_letters(web.db))
    web.marker.touch()
    done = client.post(f"/dead-letters/groups/{group.fingerprint}/requeue", data={"csrf_token": csrf})
    assert done.status_code == 303
    assert web.runner.run_until_done(second).state == "success"
    cells = _grid_cells(client.get("/fragments/dags/web_pipeline/grid").text)
    assert cells["flaky"][0] == "success,success" and cells["publish"][0] == "success,success"
    assert 'aria-label="flaky: success"' in client.get(f"/dags/web_pipeline?run={second}").text


def _trend_rows(html: str) -> dict[str, tuple[list[tuple[int, int]], str]]:
    """Task -> (its sparkline's points, the latest duration) from the DAG page's trend table."""
    found = {}
    for task, cell, latest in re.findall(
        r'<tr><th scope="row">([^<]+)</th>\s*<td>(.*?)</td>\s*<td>([^<]*)</td></tr>', html
    ):
        drawn = re.search(r'points="([^"]*)"', cell)
        pairs = [p.split(",") for p in drawn.group(1).split()] if drawn else []
        points = [(int(x), int(y)) for x, y in pairs]
        assert drawn or "no successful attempt" in cell, cell
        found[task] = (points, latest)
    return found


def test_the_duration_trend_draws_each_tasks_successful_attempts(web: Web) -> None:
    from treadle.web.render import duration

    web.marker.touch()
    first = web.runner.trigger({"limit": 3})
    assert web.runner.run_until_done(first).state == "success"
    web.marker.unlink()
    second = web.runner.trigger({"limit": 2})
    assert web.runner.run_until_done(second).state == "failed"
    client = web.client()
    sign_in(client, "fin_operator")
    for _ in range(2):  # cold, then from the finished runs' kept columns
        trends = _trend_rows(client.get("/dags/web_pipeline").text)
        assert list(trends) == ["extract", "square", "flaky", "publish"]
        flaky = [
            a.duration_s or 0.0 for a in web.runner.result(first).attempts("flaky") if a.outcome == "success"
        ]
        # flaky and publish succeeded in the first run only: one point, at the left edge.
        assert trends["flaky"] == ([(0, trends["flaky"][0][0][1])], duration(max(flaky)))
        assert len(trends["publish"][0]) == 1 and trends["publish"][0][0][0] == 0
        # extract succeeded in both: two points, the newest at the right edge, its duration shown.
        (extract,) = web.runner.result(second).attempts("extract")
        assert [x for x, _ in trends["extract"][0]] == [0, 1600]
        assert trends["extract"][1] == duration(extract.duration_s)
        # The slowest of square's mapped instances is the run's value.
        slowest = max(a.duration_s or 0.0 for a in web.runner.result(second).attempts("square"))
        assert trends["square"][1] == duration(slowest)
        assert all(30 <= y <= 250 for _, y in trends["extract"][0])


def _post_forms(html: str) -> list[str]:
    return re.findall(r'<form[^>]*method="post"[^>]*action="([^"]+)"', html)


def test_an_admin_manages_users_and_nobody_else_can(web: Web) -> None:
    chief = web.client()
    csrf = sign_in(chief, "chief")
    users = chief.get("/users")
    assert users.status_code == 200 and 'href="/users" aria-current="page"' in users.text
    assert {"/users", "/users/fin_viewer/role", "/users/fin_viewer/disable"} <= set(_post_forms(users.text))
    assert "/users/chief/disable" not in _post_forms(users.text)  # not one's own account
    short = chief.post(
        "/users",
        data={
            "csrf_token": csrf,
            "username": "dana",
            "password": "short",
            "team": "finance",
            "role": "viewer",
        },
    )
    assert short.status_code == 200 and 'role="alert"' in short.text and "12" in short.text
    assert 'value="dana"' in short.text  # the form keeps what was typed (never the password)
    made = chief.post(
        "/users",
        data={
            "csrf_token": csrf,
            "username": "dana",
            "password": PASSWORD,
            "team": "finance",
            "role": "viewer",
        },
    )
    assert made.status_code == 303 and made.headers["location"] == "/users?done=created"
    dana = next(u for u in accounts.list_users(web.db) if u.username == "dana")
    assert dana.memberships == {"finance": Role.VIEWER} and not dana.must_change_password
    moved = chief.post("/users/dana/role", data={"csrf_token": csrf, "team": "ops", "role": "operator"})
    assert moved.status_code == 303
    unknown = chief.post("/users/dana/role", data={"csrf_token": csrf, "team": "nope", "role": "viewer"})
    assert unknown.status_code == 200 and "no team &#39;nope&#39;" in unknown.text
    assert (
        chief.post(
            "/users/dana/role", data={"csrf_token": csrf, "team": "finance", "role": "none"}
        ).status_code
        == 303
    )
    dana_client = web.client()
    sign_in(dana_client, "dana")
    assert chief.post("/users/dana/disable", data={"csrf_token": csrf}).status_code == 303
    assert dana_client.get("/").status_code == 303  # the disabled user's session ended
    dana = next(u for u in accounts.list_users(web.db) if u.username == "dana")
    assert dana.memberships == {"ops": Role.OPERATOR} and not dana.is_active
    assert "/users/dana/enable" in _post_forms(chief.get("/users").text)
    mine = chief.post("/users/chief/disable", data={"csrf_token": csrf})
    assert mine.status_code == 200 and "your own account" in mine.text
    actions = [e.action for e in accounts.list_audit(web.db, actor="user:chief", limit=50)]
    assert {"user.create", "user.set_role", "user.disable", "api.request"} <= set(actions)
    for name in ("fin_operator", "fin_viewer"):
        other = web.client()
        token = sign_in(other, name)
        assert 'href="/users"' not in other.get("/").text
        refused = other.get("/users")
        assert refused.status_code == 403 and "the role admin on every team" in refused.text
        forged = other.post(
            "/users",
            data={
                "csrf_token": token,
                "username": f"{name}2",
                "password": PASSWORD,
                "team": "finance",
                "role": "admin",
            },
        )
        assert forged.status_code == 403
        assert other.post("/users/dana/enable", data={"csrf_token": token}).status_code == 403
    assert {u.username for u in accounts.list_users(web.db)} >= {"dana"}
    assert not any(u.username.endswith("2") for u in accounts.list_users(web.db))
    assert not next(u for u in accounts.list_users(web.db) if u.username == "dana").is_active


def test_api_tokens_are_shown_once_scoped_to_the_users_roles_and_revoked(web: Web) -> None:
    client = web.client()
    csrf = sign_in(client, "fin_viewer")
    assert 'href="/tokens"' in client.get("/").text
    page = client.get("/tokens")
    assert page.status_code == 200 and "No tokens yet." in page.text
    too_much = client.post(
        "/tokens",
        data={
            "csrf_token": csrf,
            "name": "ci",
            "team": "finance",
            "role": "operator",
            "expires_in_days": "30",
        },
    )
    assert too_much.status_code == 200 and "is not operator in team &#39;finance&#39;" in too_much.text
    bad_days = client.post(
        "/tokens",
        data={
            "csrf_token": csrf,
            "name": "ci",
            "team": "finance",
            "role": "viewer",
            "expires_in_days": "soon",
        },
    )
    assert bad_days.status_code == 200 and "not a whole number: &#39;soon&#39;" in bad_days.text
    made = client.post(
        "/tokens",
        data={"csrf_token": csrf, "name": "ci", "team": "finance", "role": "viewer", "expires_in_days": "30"},
    )
    assert made.status_code == 201
    secret = re.search(r'id="new-secret" class="mono secret-value" readonly value="([^"]+)"', made.text)
    assert secret, made.text
    bearer = {"Authorization": f"Bearer {secret.group(1)}", "Accept": "application/json"}
    api = web.client()
    me = api.get("/api/v1/auth/me", headers=bearer)
    assert me.status_code == 200 and me.json()["username"] == "fin_viewer"
    listed = client.get("/tokens").text
    assert secret.group(1) not in listed and "finance: viewer" in listed
    (record,) = accounts.list_tokens(web.db, username="fin_viewer")
    # Another user (even an operator) cannot revoke it; its owner can.
    other = web.client()
    other_csrf = sign_in(other, "fin_operator")
    assert other.post(f"/tokens/{record.id}/revoke", data={"csrf_token": other_csrf}).status_code == 404
    assert api.get("/api/v1/auth/me", headers=bearer).status_code == 200
    done = client.post(f"/tokens/{record.id}/revoke", data={"csrf_token": csrf})
    assert done.status_code == 303 and done.headers["location"] == "/tokens?done=revoked"
    assert api.get("/api/v1/auth/me", headers=bearer).status_code == 401
    assert "revoked" in client.get("/tokens").text
    # A token cannot make tokens, even through the page's form.
    assert api.post(
        "/tokens", data={"name": "x", "team": "finance", "role": "viewer"}, headers=bearer
    ).status_code in (
        401,
        403,
    )
    actions = {e.action for e in accounts.list_audit(web.db, actor="user:fin_viewer", limit=50)}
    assert {"token.create", "token.revoke"} <= actions
    chief = web.client()
    sign_in(chief, "chief")
    assert "Every user&#39;s tokens" in chief.get("/tokens").text


def test_pools_show_their_use_and_only_global_operators_resize_them(web: Web) -> None:
    chief = web.client()
    csrf = sign_in(chief, "chief")
    assert "No pools yet" in chief.get("/pools").text
    bad = chief.post("/pools", data={"csrf_token": csrf, "name": "warehouse", "slots": "many"})
    assert (
        bad.status_code == 200 and "slots: not a whole number" in bad.text and 'value="warehouse"' in bad.text
    )
    negative = chief.post("/pools", data={"csrf_token": csrf, "name": "warehouse", "slots": "-1"})
    assert negative.status_code == 200 and "between 0 and" in negative.text
    made = chief.post(
        "/pools",
        data={"csrf_token": csrf, "name": "warehouse", "slots": "4", "description": "the DWH's connections"},
    )
    assert made.status_code == 303
    resized = chief.post("/pools", data={"csrf_token": csrf, "name": "warehouse", "slots": "2"})
    assert resized.status_code == 303
    (pool,) = pools.list_pools(web.db)
    assert (pool.slots, pool.description) == (2, "the DWH's connections")
    html = chief.get("/pools").text
    assert "0 / 2" in html and 'aria-label="0 of 2 slots used"' in html and "/pools" in _post_forms(html)
    assert {e.action for e in accounts.list_audit(web.db, actor="user:chief", limit=20)} >= {
        "pool.created",
        "pool.resized",
    }
    for name in ("fin_operator", "fin_viewer"):
        other = web.client()
        token = sign_in(other, name)
        page = other.get("/pools")
        assert page.status_code == 200 and "warehouse" in page.text
        assert _post_forms(page.text) == ["/logout"], name
        forged = other.post("/pools", data={"csrf_token": token, "name": "warehouse", "slots": "50"})
        assert forged.status_code == 403
    assert pools.list_pools(web.db)[0].slots == 2
