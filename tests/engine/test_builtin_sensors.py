"""The sensors that ship with treadle (`treadle.sensors`), poked through the engine: a file whose
size must hold still and whose trailer must match, a SQL query, a dataset event for the run's
data interval."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from treadle import Dataset, dag, task
from treadle.sensors import dataset_sensor, file_sensor, sql_sensor
from treadle.store import task_instances as ti_store
from treadle.store.tables import dag_runs
from treadle.testing import DagRunner, run_dag


def _poke_until(runner: DagRunner, run_id: str, done: Callable[[], bool], *, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the condition did not come"
        runner._step(run_id)


def _pokes(runner: DagRunner, run_id: str, task_id: str) -> list[str]:
    return [a.outcome for a in runner.result(run_id).attempts(task_id)]


def _state(runner: DagRunner, run_id: str, task_id: str) -> str:
    with runner.db.read() as conn:
        return next(t.state for t in ti_store.list_for_run(conn, run_id) if t.task_id == task_id)


@task
def consume(found: dict) -> dict:
    return found


def test_file_sensor_waits_for_a_stable_size_and_a_matching_trailer(db_url: str, tmp_path: Path) -> None:
    data, marker = tmp_path / "orders.csv", tmp_path / "orders.done"

    @dag(dag_id="files")
    def files() -> None:
        consume(
            file_sensor(
                str(data),
                trailer_prefix="TRAILER",
                header_lines=1,
                marker=str(marker),
                min_watermark="2026-12-01",
                poke_interval=0.02,
                timeout=120,
            )
        )

    runner = DagRunner(files, database_url=db_url)
    try:
        run_id = runner.trigger()
        _poke_until(runner, run_id, lambda: len(_pokes(runner, run_id, "file_sensor")) >= 2)
        data.write_text("id,amount\n1,10\n")
        _poke_until(runner, run_id, lambda: len(_pokes(runner, run_id, "file_sensor")) >= 5)
        data.write_text("id,amount\n1,10\n2,20\nTRAILER|2\n")
        marker.write_text(json.dumps({"status": "running", "watermark": "2026-11-30"}))
        _poke_until(runner, run_id, lambda: len(_pokes(runner, run_id, "file_sensor")) >= 8)
        assert _state(runner, run_id, "file_sensor") == "up_for_reschedule"  # the producer is not done
        marker.write_text(json.dumps({"status": "complete", "watermark": "2026-12-01T06:00:00Z"}))
        result = runner.run_until_done(run_id)
        assert result.state == "success"
        attempts = result.attempts("file_sensor")
        assert {a.outcome for a in attempts[:-1]} == {"rescheduled"} and attempts[-1].outcome == "success"
        assert attempts[0].outputs == {"evidence": {"exists": False}}
        evidence = {
            "path": str(data),
            "size": data.stat().st_size,
            "sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
            "rows": 2,
            "trailer_count": 2,
            "producer_status": "complete",
            "watermark": "2026-12-01T06:00:00Z",
        }
        assert attempts[-1].outputs == {"evidence": evidence}
        assert result.results["consume"] == evidence
    finally:
        runner.close()


def test_sql_sensor_waits_for_a_truthy_value(db_url: str) -> None:
    @dag(dag_id="sql")
    def sql() -> None:
        consume(
            sql_sensor(
                db_url,
                "SELECT max(ready) FROM sensor_flags WHERE name = :name",
                parameters={"name": "orders"},
                poke_interval=0.02,
                timeout=120,
            )
        )

    runner = DagRunner(sql, database_url=db_url)
    flags = sa.Table(
        "sensor_flags", sa.MetaData(), sa.Column("name", sa.String(50)), sa.Column("ready", sa.Integer)
    )
    try:
        with runner.db.begin() as conn:
            flags.create(conn)
        run_id = runner.trigger()
        _poke_until(runner, run_id, lambda: len(_pokes(runner, run_id, "sql_sensor")) >= 3)
        assert runner.result(run_id).attempts("sql_sensor")[0].outputs == {"evidence": {"value": None}}
        with runner.db.begin() as conn:
            conn.execute(flags.insert().values(name="orders", ready=7))
        result = runner.run_until_done(run_id)
        assert result.state == "success" and result.results["sql_sensor"] == 7
    finally:
        with runner.db.begin() as conn:
            flags.drop(conn)
        runner.close()


ORDERS = Dataset("warehouse.orders")


@task(outlets=[ORDERS], queue="producers")  # its runner must not take the sensor's pokes
def produce() -> None:
    return None


def test_dataset_sensor_waits_for_an_event_covering_the_run_interval(db_url: str) -> None:
    @dag(dag_id="consumer")
    def consumer() -> None:
        consume(dataset_sensor(ORDERS, database_url=db_url, poke_interval=0.02, timeout=120))

    @dag(dag_id="producer")
    def producer() -> None:
        produce()

    runner = DagRunner(consumer, database_url=db_url)
    try:
        run_id = runner.trigger()
        _poke_until(runner, run_id, lambda: len(_pokes(runner, run_id, "dataset_sensor")) >= 3)
        produced = run_dag(producer, database_url=db_url)
        # The producer's run covers the consumer's interval (a manual run's is one instant).
        wide = datetime.now(UTC) - timedelta(days=1), datetime.now(UTC) + timedelta(days=1)
        with runner.db.begin() as conn:
            conn.execute(
                dag_runs.update()
                .where(dag_runs.c.run_id == produced.run.run_id)
                .values(data_interval_start=wide[0], data_interval_end=wide[1])
            )
        result = runner.run_until_done(run_id)
        assert result.state == "success"
        found = result.results["dataset_sensor"]
        assert found["producer_run_id"] == produced.run.run_id and found["producer"] == "producer.produce"
    finally:
        runner.close()
