"""`treadle api` as a real process: secure start-up, login, tokens, triggers, audit over HTTP."""

from __future__ import annotations

import getpass
import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers.processes import run_cli, running, treadle_env
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.e2e

DAG_FILE = """
from treadle import dag, task

@task
def hello() -> str:
    return "hi"

@dag(dag_id="api_e2e", team="default")
def api_e2e() -> None:
    hello()
"""
KEY = "e2e-secret-key-that-is-long-enough-for-treadle"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli_stdin(args: list[str], env: dict[str, str], stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "treadle.cli", *args],
        env=env,
        input=stdin,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "api_e2e.py").write_text(DAG_FILE)
    return treadle_env(
        database_url=f"sqlite:///{tmp_path / 'home' / 'treadle.db'}", dags_folder=dags, home=tmp_path / "home"
    )


def test_api_process_bootstraps_serves_and_audits(env: dict[str, str], tmp_path: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**env, "TREADLE_ADMIN_PASSWORD": "first admin password"}
    log = tmp_path / "api.log"
    with running(["api", "--port", str(port)], env, log) as proc:
        wait_for(lambda: _up(base) or proc.poll() is not None, timeout=60, message="the API to answer")
        assert proc.poll() is None, log.read_text()
        assert "created user admin with the password in TREADLE_ADMIN_PASSWORD" in log.read_text()
        assert httpx.get(f"{base}/api/v1/dags", timeout=60).status_code == 401
        assert run_cli(["dags", "sync"], env).returncode == 0

        client = httpx.Client(base_url=base, timeout=60)
        login = client.post(
            "/api/v1/auth/login", json={"username": "admin", "password": "first admin password"}
        )
        assert login.status_code == 200, login.text
        csrf = login.json()["csrf_token"]
        assert client.get("/api/v1/dags").status_code == 403
        changed = client.post(
            "/api/v1/auth/password",
            json={"current_password": "first admin password", "new_password": "second admin password"},
            headers={"X-CSRF-Token": csrf},
        )
        assert changed.status_code == 200, changed.text
        csrf = changed.json()["csrf_token"]
        made = client.post(
            "/api/v1/tokens",
            json={"name": "ci", "team": "default", "role": "operator"},
            headers={"X-CSRF-Token": csrf},
        )
        token = made.json()["token"]
        bearer = {"Authorization": f"Bearer {token}"}
        run = httpx.post(f"{base}/api/v1/dags/api_e2e/runs", json={"conf": {}}, headers=bearer, timeout=60)
        assert run.status_code == 201, run.text
        assert (
            httpx.get(f"{base}/api/v1/runs/{run.json()['run_id']}", headers=bearer, timeout=60).json()["run"][
                "dag_id"
            ]
            == "api_e2e"
        )
        assert "content-security-policy" in run.headers

    # The CLI's changes are audited too, as cli:<os user>.
    assert (
        _cli_stdin(
            ["users", "create", "bob", "--role", "operator", "--password-stdin"], env, "bobs password 1\n"
        ).returncode
        == 0
    )
    assert run_cli(["dags", "trigger", "api_e2e"], env).returncode == 0
    made_token = run_cli(["tokens", "create", "bob", "--name", "deploy", "--role", "viewer", "--json"], env)
    assert made_token.returncode == 0, made_token.stderr
    assert run_cli(["tokens", "revoke", str(json.loads(made_token.stdout)["id"])], env).returncode == 0
    audit = run_cli(["audit", "--json", "--since", "1h"], env)
    assert audit.returncode == 0, audit.stderr
    entries = json.loads(audit.stdout)
    me = f"cli:{getpass.getuser()}"
    by_cli = {e["action"] for e in entries if e["actor"] == me}
    assert {"user.create", "run.trigger", "token.create", "token.revoke"} <= by_cli
    api_trigger = next(e for e in entries if e["action"] == "run.trigger" and e["actor"] != me)
    assert api_trigger["actor"].startswith("token:") and api_trigger["address"] == "127.0.0.1"
    only_mine = json.loads(run_cli(["audit", "--json", "--actor", me], env).stdout)
    assert only_mine and {e["actor"] for e in only_mine} == {me}


def test_api_refuses_an_exposed_start_until_key_and_password_are_set(
    env: dict[str, str], tmp_path: Path
) -> None:
    exposed = ["api", "--host", "0.0.0.0", "--port", str(_free_port())]
    no_key = run_cli(exposed, env)
    assert no_key.returncode == 2
    assert "TREADLE_SECRET_KEY is not set" in no_key.stderr
    assert "bootstrap password of user `admin` is unchanged" in no_key.stderr
    assert "created user admin with the one-time password:" in no_key.stderr

    default_key = run_cli(exposed, {**env, "TREADLE_SECRET_KEY": "changeme"})
    assert default_key.returncode == 2 and "well-known default" in default_key.stderr

    with_key = run_cli(exposed, {**env, "TREADLE_SECRET_KEY": KEY})
    assert with_key.returncode == 2 and "treadle users set-password admin" in with_key.stderr
    assert "TREADLE_SECRET_KEY" not in with_key.stderr

    assert (
        _cli_stdin(
            ["users", "set-password", "admin", "--password-stdin"], env, "a chosen admin password\n"
        ).returncode
        == 0
    )
    port = _free_port()
    log = tmp_path / "exposed.log"
    with running(
        ["api", "--host", "0.0.0.0", "--port", str(port)], {**env, "TREADLE_SECRET_KEY": KEY}, log
    ) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(base) or proc.poll() is not None, timeout=60, message="the API to answer")
        assert proc.poll() is None, log.read_text()
        login = httpx.post(
            f"{base}/api/v1/auth/login", json={"username": "admin", "password": "a chosen admin password"}
        )
        assert login.status_code == 200 and login.json()["must_change_password"] is False


def test_standalone_serves_the_api_and_stops_cleanly(env: dict[str, str], tmp_path: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "standalone.log"
    args = ["standalone", "--api-port", str(port)]
    with running(args, {**env, "TREADLE_ADMIN_PASSWORD": "standalone password"}, log) as proc:
        wait_for(lambda: _up(base) or proc.poll() is not None, timeout=90, message="the API to answer")
        assert proc.poll() is None, log.read_text()
        login = httpx.post(
            f"{base}/api/v1/auth/login",
            json={"username": "admin", "password": "standalone password"},
            timeout=60,
        )
        assert login.status_code == 200 and login.json()["must_change_password"] is True
        # A second standalone on the same port runs without the API and says why.
        second_log = tmp_path / "second.log"
        with running(args, env, second_log) as second:
            wait_for(
                lambda: "REST API not started" in second_log.read_text() or second.poll() is not None,
                timeout=90,
            )
            assert second.poll() is None, second_log.read_text()
    assert proc.returncode == 0, log.read_text()
    assert not _up(base)
