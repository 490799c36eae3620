"""Web UI server times per page on PostgreSQL: a long run history and a 500-task DAG.

Seeds `--runs` one-task runs (default 100,000) and `--wide-runs` runs (default 25) of a DAG of
500 tasks, signs in through the login form, and times every page `--repeat` times in-process
(the ASGI app driven by a TestClient: the server's time, no network). The DAG page of the wide
DAG draws its grid of 25 runs x 500 tasks.

The history is made finished with SQL, as it would be in a real database: every run but the
newest wide one succeeded, with one successful attempt per task; the newest wide run is running
(a fifth of its tasks done, some running, the rest queued or pending). The pages read finished
runs' grid columns once and keep them, so the `*_uncached` entries time the same pages with that
cache emptied before each request (the first view after a restart, or 25 runs all still live).

Prints one JSON object: p50 / p95 / max and the HTML size per page.
"""

from __future__ import annotations

import argparse
import os
import re
import time
import warnings
from datetime import timedelta
from typing import Any

from _common import emit, machine, percentile, pg_database

from treadle import dag, task
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.access import ALL_TEAMS, Role
from treadle.domain.dag_version import DagVersion
from treadle.domain.states import RunType
from treadle.engine import accounts
from treadle.engine.accounts import Caller
from treadle.engine.dags import sync_dags
from treadle.engine.runs import new_run
from treadle.store import migrate
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now
from treadle.web import views

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

PASSWORD = "benchmark admin password"


@task
def noop() -> None:
    return None


@dag(dag_id="bench_web_small")
def small() -> None:
    noop()


@dag(dag_id="bench_web_wide")
def wide() -> None:
    for _ in range(500):
        noop()


def seed(db: Database, runs: int, wide_runs: int) -> list[str]:
    """Insert the runs (created a second apart, newest last); the wide runs' ids."""
    versions = sync_dags(
        db, structures=[small.structure(), wide.structure()], scanned_files=[], errors={}
    ).versions
    small_v = DagVersion.of(versions["bench_web_small"], small.structure())
    wide_v = DagVersion.of(versions["bench_web_wide"], wide.structure())
    now = db.query(db_now)
    done = 0
    while done < runs:
        batch = min(2000, runs - done)
        made = [_run(small_v, now - timedelta(seconds=runs - done - i)) for i in range(batch)]
        with db.begin() as conn:
            run_store.insert_runs(conn, [r for r, _ in made])
            ti_store.insert_task_instances(conn, [row for _, rows in made for row in rows])
        done += batch
    wide_ids = []
    for i in range(wide_runs):
        run, rows = _run(wide_v, now + timedelta(seconds=i + 1))
        with db.begin() as conn:
            run_store.insert_runs(conn, [run])
            ti_store.insert_task_instances(conn, rows)
        wide_ids.append(run.run_id)
    finish(db, newest=wide_ids[-1] if wide_ids else None)
    with db.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    return wide_ids


def finish(db: Database, *, newest: str | None) -> None:
    """Every run but `newest` succeeded (tasks and one attempt each, 1-10 s); `newest` runs."""
    with db.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE dag_runs SET state = 'success', started_at = created_at,"
            " ended_at = created_at + interval '12 seconds' WHERE run_id <> %(newest)s",
            {"newest": newest or ""},
        )
        conn.exec_driver_sql(
            "UPDATE task_instances SET state = 'success' WHERE run_id <> %(newest)s", {"newest": newest or ""}
        )
        conn.exec_driver_sql(
            "INSERT INTO task_attempts (task_instance_id, run_id, dag_id, task_id, attempt, outcome,"
            " worker_id, started_at, ended_at, duration_s)"
            " SELECT ti.id, ti.run_id, ti.dag_id, ti.task_id, 1, 'success', 'bench', r.started_at,"
            " r.ended_at, 1 + mod(ti.id, 90) / 10.0 FROM task_instances ti"
            " JOIN dag_runs r ON r.run_id = ti.run_id WHERE ti.state = 'success'"
        )
        if newest is not None:
            conn.exec_driver_sql(
                "UPDATE dag_runs SET state = 'running', started_at = created_at WHERE run_id = %(newest)s",
                {"newest": newest},
            )
            conn.exec_driver_sql(
                "UPDATE task_instances SET state = CASE WHEN mod(id, 5) = 0 THEN 'success'"
                " WHEN mod(id, 5) = 1 THEN 'running' WHEN mod(id, 5) = 2 THEN 'queued' ELSE 'pending' END"
                " WHERE run_id = %(newest)s",
                {"newest": newest},
            )


def _run(version: DagVersion, at: Any) -> Any:  # Any: (RunInfo, rows) as new_run builds them
    return new_run(
        version,
        run_type=RunType.MANUAL,
        logical_date=at,
        data_interval=(at, at),
        conf={},
        params={},
        triggered_by="bench",
        now=at,
        default_queue_timeout_s=600,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--wide-runs", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with pg_database("bench_web") as url:
        db = Database(url, pool_size=4)
        migrate.upgrade(db)
        started = time.perf_counter()
        wide_ids = seed(db, args.runs, args.wide_runs)
        seed_s = time.perf_counter() - started
        accounts.create_user(db, "bench", PASSWORD, team=ALL_TEAMS, role=Role.ADMIN, by=Caller(actor="bench"))
        client = TestClient(
            create_app(db, ApiSettings(), secret_key="b" * 48),
            follow_redirects=False,
            headers={"Accept": "text/html"},
        )
        assert client.post("/login", data={"username": "bench", "password": PASSWORD}).status_code == 303
        newest = wide_ids[-1]
        task_id = re.search(r'/tasks/([^"?]+)', client.get(f"/runs/{newest}").text)
        assert task_id is not None
        pages = {
            "dag_list": "/",
            "dag_page_500_tasks": "/dags/bench_web_wide",
            "grid_fragment_25x500": "/fragments/dags/bench_web_wide/grid",
            "dag_page_500_tasks_uncached": "/dags/bench_web_wide",
            "grid_fragment_25x500_uncached": "/fragments/dags/bench_web_wide/grid",
            "dag_page_small_long_history": "/dags/bench_web_small",
            "run_500_tasks": f"/runs/{newest}",
            "task_instance": f"/runs/{newest}/tasks/{task_id.group(1)}",
            "dead_letters": "/dead-letters",
            "operations": "/operations",
            "audit": "/audit",
        }
        figures: dict[str, Any] = {}
        for name, path in pages.items():
            times: list[float] = []
            size = 0
            for _ in range(args.repeat):
                if name.endswith("_uncached"):
                    views.forget_finished_columns()
                start = time.perf_counter()
                response = client.get(path)
                times.append(time.perf_counter() - start)
                assert response.status_code == 200, (path, response.status_code)
                size = len(response.content)
            figures[name] = {
                "n": len(times),
                "p50_ms": round(percentile(times, 50) * 1000, 1),
                "p95_ms": round(percentile(times, 95) * 1000, 1),
                "max_ms": round(max(times) * 1000, 1),
                "html_kb": round(size / 1024, 1),
            }
        client.close()
        db.dispose()
    emit(
        {
            "benchmark": "web_pages",
            "machine": machine(),
            # The figures scale with the machine's load: say what it was.
            "load_average_1m": round(os.getloadavg()[0], 2),
            "runs": args.runs,
            "seed_s": round(seed_s, 1),
            "pages": figures,
        }
    )


if __name__ == "__main__":
    main()
