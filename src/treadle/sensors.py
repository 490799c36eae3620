"""Sensors that ship with treadle. Each call inside a `@dag` function places one sensor task and
returns its output; the usual sensor settings apply (`poke_interval`, `timeout`, `soft_fail`,
retry settings, `task_id`).

    from treadle.sensors import dataset_sensor, file_sensor, sql_sensor

    @dag(schedule="@daily")
    def orders():
        landed = file_sensor("/data/in/orders.csv", trailer_prefix="TRAILER", poke_interval=300)
        load(landed)

- `file_sensor`: the file exists and its size stayed the same across two pokes (a writer has
  finished); optionally its trailer line's row count matches and a producer's marker file says
  it is complete up to a watermark. The evidence (size, sha256 checksum, rows, trailer count,
  producer status, watermark) is recorded with the attempt and is the result.
- `sql_sensor`: a query on any SQLAlchemy URL returns a truthy first value.
- `dataset_sensor`: a dataset has an event from a run whose data interval covers this run's.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from treadle.authoring.context import TaskContext
from treadle.authoring.sensing import Ready, Waiting, sensor
from treadle.authoring.specs import TaskOutput
from treadle.domain.sensing import DEFAULT_SENSOR_TIMEOUT_S

__all__ = ["dataset_sensor", "file_sensor", "sql_sensor"]

Seconds = float | timedelta


def _previous(context: TaskContext) -> dict[str, Any]:
    state = context.poke.state if context.poke is not None else None
    return state if isinstance(state, dict) else {}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _trailer(path: Path, prefix: str, header_lines: int) -> tuple[int, int | None]:
    """(data rows, the count the trailer line announces or None if the last line is no trailer)."""
    lines = path.read_text(errors="replace").splitlines()
    if not lines or not lines[-1].startswith(prefix):
        return max(len(lines) - header_lines, 0), None
    announced = lines[-1][len(prefix) :].strip(" |,;:\t")
    rows = max(len(lines) - 1 - header_lines, 0)
    return rows, int(announced) if announced.isdigit() else None


def _marker(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_file(
    path: str,
    *,
    checksum: bool,
    trailer_prefix: str | None,
    header_lines: int,
    marker: str | None,
    producer_status: str,
    min_watermark: str | None,
    context: TaskContext,
) -> Ready | Waiting:
    """One poke of `file_sensor` (see there)."""
    target = Path(path)
    try:
        stat = target.stat()
    except FileNotFoundError:
        return Waiting(evidence={"exists": False})
    seen = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if _previous(context).get("seen") != seen:  # new, or still growing: look again next poke
        return Waiting(state={"seen": seen}, evidence={"exists": True, "size": stat.st_size})
    evidence: dict[str, Any] = {"path": str(target), "size": stat.st_size}
    if checksum:
        evidence["sha256"] = _sha256(target)
    if trailer_prefix is not None:
        rows, announced = _trailer(target, trailer_prefix, header_lines)
        evidence.update(rows=rows, trailer_count=announced)
        if announced != rows:  # no trailer yet, or the rows are not all there
            return Waiting(state={"seen": seen}, evidence=evidence)
    if marker is not None:
        found = _marker(Path(marker))
        status = found.get("status") if found else None
        watermark = found.get("watermark") if found else None
        evidence.update(producer_status=status, watermark=watermark)
        if status != producer_status or (
            min_watermark is not None and (watermark is None or str(watermark) < min_watermark)
        ):
            return Waiting(state={"seen": seen}, evidence=evidence)
    return Ready(value=evidence, evidence=evidence)


def file_sensor(
    path: str,
    *,
    checksum: bool = True,
    trailer_prefix: str | None = None,
    header_lines: int = 0,
    marker: str | None = None,
    producer_status: str = "complete",
    min_watermark: str | None = None,
    poke_interval: Seconds = 60.0,
    timeout: Seconds | None = DEFAULT_SENSOR_TIMEOUT_S,
    soft_fail: bool = False,
    task_id: str | None = None,
    **settings: Any,
) -> TaskOutput:
    """Wait until `path` exists and its size and modification time stayed the same across two
    pokes (its writer has finished), then succeed with the evidence as result.

    `trailer_prefix`: the last line is a trailer such as ``TRAILER|1042`` announcing the number
    of data rows (after `header_lines` header lines): wait until they match. `marker`: a JSON
    file the producer writes, ``{"status": "complete", "watermark": "2026-12-01T00:00:00Z"}``:
    wait until its status is `producer_status` and, if `min_watermark` is given, its watermark
    is at least that (compared as text: use ISO dates).
    """
    poke = sensor(
        poke_interval=poke_interval,
        timeout=timeout,
        soft_fail=soft_fail,
        task_id=task_id or "file_sensor",
        **settings,
    )(check_file)
    output: TaskOutput = poke(
        path,
        checksum=checksum,
        trailer_prefix=trailer_prefix,
        header_lines=header_lines,
        marker=marker,
        producer_status=producer_status,
        min_watermark=min_watermark,
    )
    return output


def check_query(url: str, query: str, parameters: dict[str, Any] | None) -> Ready | Waiting:
    """One poke of `sql_sensor` (see there)."""
    from treadle.store.external import first_value

    value = first_value(url, query, parameters)
    shown = value if value is None or isinstance(value, bool | int | float | str) else str(value)
    if not value:
        return Waiting(evidence={"value": shown})
    return Ready(value=shown, evidence={"value": shown})


def sql_sensor(
    url: str,
    query: str,
    *,
    parameters: dict[str, Any] | None = None,
    poke_interval: Seconds = 60.0,
    timeout: Seconds | None = DEFAULT_SENSOR_TIMEOUT_S,
    soft_fail: bool = False,
    task_id: str | None = None,
    **settings: Any,
) -> TaskOutput:
    """Wait until `query` (bound `:name` parameters from `parameters`) returns a truthy first
    value on the database at SQLAlchemy `url`; the value is the result and the evidence.

    The URL is stored in the DAG's version like any argument: keep passwords out of it (use a
    server-side credential or `~/.pgpass`).
    """
    poke = sensor(
        poke_interval=poke_interval,
        timeout=timeout,
        soft_fail=soft_fail,
        task_id=task_id or "sql_sensor",
        **settings,
    )(check_query)
    output: TaskOutput = poke(url, query, parameters)
    return output


def check_dataset(dataset: str, database_url: str | None, *, context: TaskContext) -> Ready | Waiting:
    """One poke of `dataset_sensor` (see there)."""
    from treadle.engine.sensing import dataset_event_for_interval
    from treadle.store.database import Database

    manifest = context.manifest or {}
    start, end = manifest.get("data_interval_start"), manifest.get("data_interval_end")
    if not start or not end:
        raise ValueError(f"run {context.run_id} has no data interval: dataset_sensor needs a scheduled run")
    url = database_url or os.environ.get("TREADLE_DATABASE_URL")
    if not url:
        home = Path(os.environ.get("TREADLE_HOME", Path.home() / ".treadle"))
        url = f"sqlite:///{home / 'treadle.db'}"
    db = Database(url, application_name="treadle-dataset-sensor", pool_size=1)
    try:
        event = dataset_event_for_interval(
            db, dataset, start=datetime.fromisoformat(start), end=datetime.fromisoformat(end)
        )
    finally:
        db.dispose()
    interval = {"data_interval_start": start, "data_interval_end": end}
    if event is None:
        return Waiting(evidence={"dataset": dataset, **interval, "event": None})
    found = {
        "dataset": dataset,
        **interval,
        "event_id": event["id"],
        "producer_run_id": event["run_id"],
        "producer": f"{event['dag_id']}.{event['task_id']}",
        "version": event["version"],
        "created_at": event["created_at"].isoformat(),
    }
    return Ready(value=found, evidence=found)


def dataset_sensor(
    dataset: Any,
    *,
    database_url: str | None = None,
    poke_interval: Seconds = 60.0,
    timeout: Seconds | None = DEFAULT_SENSOR_TIMEOUT_S,
    soft_fail: bool = False,
    task_id: str | None = None,
    **settings: Any,
) -> TaskOutput:
    """Wait until `dataset` (a `Dataset` or its name) has an event recorded by a run whose data
    interval covers this run's; the event (producer, version, time) is the result.

    Reads treadle's own database (`database_url`, else TREADLE_DATABASE_URL as the worker has it).
    """
    name = dataset if isinstance(dataset, str) else dataset.name
    poke = sensor(
        poke_interval=poke_interval,
        timeout=timeout,
        soft_fail=soft_fail,
        task_id=task_id or "dataset_sensor",
        **settings,
    )(check_dataset)
    output: TaskOutput = poke(name, database_url)
    return output
