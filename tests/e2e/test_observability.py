"""A worker's and a scheduler's metrics port: series move as tasks run, readiness follows the
database, process logs are JSON lines with the attempt's ids, and task output stays in the
attempt's log file (never in the process log).

The outage is a database that refuses connections (ALLOW_CONNECTIONS false, its sessions ended),
not a stopped server: other tests share the server.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import PG_ADMIN_URL
from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(120)]

DAG = """
    import sys

    from treadle import dag, task


    @task
    def say() -> int:
        print("TASK-OUTPUT-MARKER on stdout")
        print("TASK-OUTPUT-MARKER on stderr", file=sys.stderr)
        return 1


    @task(retries=1, retry_delay=0)
    def fail() -> None:
        print("TASK-OUTPUT-MARKER before failing")
        raise RuntimeError("always")


    @dag(dag_id="observed")
    def observed() -> None:
        say()
        fail()


    observed()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def readiness(port: int) -> tuple[int, dict[str, Any]]:
    status, text = get(port, "/readyz")
    return status, (json.loads(text) if text else {})


def set_connections(dbname: str, *, allowed: bool) -> None:
    """Let the database take connections, or refuse new ones and end the open ones."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,)
            )


def test_metrics_move_readiness_follows_the_database_and_task_output_stays_out(
    pg_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(pg_url, TREADLE_LOG_FORMAT="json")
    c.write_dag("observed.py", DAG)
    assert c.cli("db", "upgrade").returncode == 0
    w_port, s_port = free_port(), free_port()
    c.start("worker", "worker", "--concurrency", "2", env={"TREADLE_METRICS_PORT": str(w_port)})
    c.start("scheduler", "scheduler", env={"TREADLE_METRICS_PORT": str(s_port)})
    for port in (w_port, s_port):
        wait_for(lambda p=port: readiness(p)[0] == 200, timeout=60, message=f"port {port} ready")
    assert get(w_port, "/healthz")[0] == 200
    c.wait_dag("observed")

    run_id = c.trigger("observed")
    c.wait_run(run_id, timeout=60)
    worker = samples(w_port)
    say, fail = (("dag_id", "observed"), ("task_id", "say")), (("dag_id", "observed"), ("task_id", "fail"))
    assert worker[("treadle_task_outcomes_total", (say[0], ("outcome", "success"), say[1]))] == 1
    assert worker[("treadle_task_outcomes_total", (fail[0], ("outcome", "failed"), fail[1]))] == 2
    assert worker[("treadle_task_retries_total", fail)] == 1
    assert worker[("treadle_dead_letters_total", fail)] == 1
    assert worker[("treadle_task_duration_seconds_count", (("dag_id", "observed"),))] == 3
    assert worker[("treadle_task_start_delay_seconds_count", (("dag_id", "observed"),))] == 3
    assert worker[("treadle_worker_slots", ())] == 2
    scheduler = samples(s_port)
    assert scheduler[("treadle_scheduler_leader", ())] == 1
    assert scheduler[("treadle_leader_present", ())] == 1
    assert scheduler[("treadle_database_call_seconds_count", (("kind", "write"),))] > 0

    # Task output is in the attempt's log file, never in the worker's own log.
    shown = c.cli("logs", run_id, "say")
    assert "TASK-OUTPUT-MARKER on stdout" in shown.stdout and "on stderr" in shown.stdout
    assert "TASK-OUTPUT-MARKER" not in c.log("worker")
    lines = [json.loads(line) for line in c.log("worker").splitlines() if line.startswith("{")]
    failed = [line for line in lines if line.get("event") == "worker.attempt_failed"]
    assert len(failed) == 2
    assert {k: failed[0][k] for k in ("run_id", "dag_id", "task_id", "map_index")} == {
        "run_id": run_id,
        "dag_id": "observed",
        "task_id": "fail",
        "map_index": -1,
    }
    assert {f["attempt"] for f in failed} == {1, 2} and failed[0]["worker_id"]

    dbname = pg_url.rpartition("/")[2]
    set_connections(dbname, allowed=False)
    try:
        for port in (w_port, s_port):
            _status, body = wait_for(
                lambda p=port: (r := readiness(p))[0] == 503 and r,
                timeout=60,
                message=f"port {port} unready",
            )
            database = next(check for check in body["checks"] if check["name"] == "database")
            assert database["ok"] is False and body["status"] == "unavailable"
        assert get(w_port, "/healthz")[0] == 200  # alive all the same: no restart wanted
    finally:
        set_connections(dbname, allowed=True)
    for port in (w_port, s_port):
        wait_for(lambda p=port: readiness(p)[0] == 200, timeout=60, message=f"port {port} ready again")


def test_standalone_serves_its_scheduler_and_worker_metrics_on_the_api(
    tmp_path: Path, cluster: Callable[..., Cluster]
) -> None:
    port = free_port()
    c = cluster(f"sqlite:///{tmp_path / 'standalone.db'}", TREADLE_API_METRICS_PUBLIC="1")
    c.write_dag("observed.py", DAG)
    c.start("standalone", "standalone", "--concurrency", "2", "--api-port", str(port))
    wait_for(lambda: get(port, "/readyz")[0] == 200, timeout=60, message="the standalone API ready")
    c.wait_dag("observed")
    run_id = c.trigger("observed")
    c.wait_run(run_id, timeout=60)
    got = samples(port)
    assert (
        got[
            (
                "treadle_task_outcomes_total",
                (("dag_id", "observed"), ("outcome", "success"), ("task_id", "say")),
            )
        ]
        == 1
    )
    assert got[("treadle_scheduler_leader", ())] == 1
    assert got[("treadle_worker_slots", ())] == 2
    assert got[("treadle_database_up", ())] == 1
    # Served once, by the API: the scheduler's database gauges are not repeated.
    status, text = get(port, "/metrics")
    assert status == 200 and text.count("\ntreadle_leader_present ") == 1
