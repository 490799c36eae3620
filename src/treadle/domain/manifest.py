"""The run manifest: what a run is, fixed when it is created and handed to every task.

It answers "which data, which code, which inputs, who asked" without a database: tasks read
it as `context.manifest`, and subprocesses a task starts find it as a JSON file named by the
environment variable `TREADLE_MANIFEST_FILE`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

#: Version of the manifest's layout; bumped when a key changes meaning.
MANIFEST_VERSION = 1


def build_manifest(
    *,
    run_id: str,
    dag_id: str,
    version_hash: str,
    logical_date: datetime,
    data_interval: tuple[datetime, datetime],
    run_type: str,
    mode: str,
    params: Mapping[str, Any],
    triggered_by: str,
    requested_at: datetime,
    backfill_id: int | None = None,
    consumed_events: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Return the manifest of one run (a JSON object; datetimes as ISO-8601 UTC)."""
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "run_id": run_id,
        "dag_id": dag_id,
        "dag_version_hash": version_hash,
        "logical_date": logical_date.isoformat(),
        "data_interval_start": data_interval[0].isoformat(),
        "data_interval_end": data_interval[1].isoformat(),
        "run_type": run_type,
        "mode": mode,
        "params": dict(params),
        "triggered_by": triggered_by,
        "requested_at": requested_at.isoformat(),
    }
    if backfill_id is not None:
        manifest["backfill_id"] = backfill_id
    if consumed_events:
        manifest["consumed_dataset_events"] = [dict(e) for e in consumed_events]
    return manifest
