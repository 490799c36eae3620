"""The core install, without the `web` extra: the scheduler, the worker and the CLI run a DAG on
SQLite with none of FastAPI, pydantic, uvicorn, Jinja2, itsdangerous or argon2 importable, and
what needs them (the REST API, hashing a password) says which extra to install."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.extras import WEB_MODULES

pytestmark = pytest.mark.e2e

#: Every interpreter the test starts (task processes too) finds these modules missing.
BLOCKER = "import sys\n\nfor _name in {modules!r}:\n    sys.modules[_name] = None\n"

HELLO_DAG = """
    from treadle import dag, task


    @task
    def hello() -> str:
        return "hello"


    @dag(dag_id="core_only")
    def core_only() -> None:
        hello()
"""

EXTRA = "pip install 'treadle[web]'"


@pytest.fixture
def core(cluster: Callable[..., Cluster], sqlite_url: str, tmp_path: Path) -> Cluster:
    """A cluster whose processes cannot import the web extra's modules."""
    site = tmp_path / "core-only-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(modules=tuple(WEB_MODULES)))
    python_path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    made = cluster(sqlite_url, PYTHONPATH=python_path)
    for module in WEB_MODULES:
        probe = subprocess.run(
            [sys.executable, "-c", f"import {module}"], env=made.env, capture_output=True, check=False
        )
        assert probe.returncode != 0, f"{module} is still importable: the test would prove nothing"
    return made


def test_a_dag_runs_on_the_core_install_and_standalone_says_why_it_serves_no_ui(core: Cluster) -> None:
    core.write_dag("core_only.py", HELLO_DAG)
    core.start("standalone", "standalone", "--api-port", "0")
    wait_for(
        lambda: "REST API not started" in core.log("standalone"),
        timeout=90,
        message="standalone to say the API is not started",
    )
    said = core.log("standalone")
    assert EXTRA in said and "fastapi" in said, said
    core.wait_started("standalone")
    core.wait_dag("core_only", timeout=60)
    run_id = core.trigger("core_only")
    detail = core.wait_run(run_id, timeout=120)
    assert detail.run.state == "success", core.logs_tail()
    assert "Traceback" not in core.log("standalone")
    listed = core.cli_json("runs", "list")
    assert [r["run_id"] for r in listed] == [run_id]


def test_what_needs_the_web_extra_is_refused_naming_it(core: Cluster) -> None:
    api = core.cli("api", "--port", "0")
    assert api.returncode == 2, api.stderr
    assert EXTRA in api.stderr and "uvicorn" in api.stderr, api.stderr
    assert "Traceback" not in api.stderr
    password = subprocess.run(
        [sys.executable, "-m", "treadle.cli", "users", "create", "dana", "--password-stdin"],
        input="a long enough passphrase for dana\n",
        env=core.env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert password.returncode == 2, password.stderr
    assert EXTRA in password.stderr and "argon2-cffi" in password.stderr, password.stderr
    assert "Traceback" not in password.stderr
    # Nothing was stored: the user was refused before any write.
    users = core.cli_json("users", "list")
    assert "dana" not in [u["username"] for u in users]
