"""The run manifest: what a run is, fixed when it is created and handed to every task.

It answers "which data, which code, which inputs, who asked" without a database: tasks read
it as `context.manifest`, and subprocesses a task starts find it as a JSON file named by the
environment variable `TREADLE_MANIFEST_FILE`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: Version of the manifest's layout; bumped when a key changes meaning.
MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetConsumption:
    """The dataset events a dataset-triggered run consumed."""

    #: The events listed one by one (bounded), oldest first. Any: JSON.
    events: Sequence[Mapping[str, Any]] = ()
    #: How many events were consumed in all (the list may be shorter).
    total: int = 0
    #: Per dataset: {"after_id", "through_id", "count"} of the consumed range. Any: JSON.
    ranges: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


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
    consumed: DatasetConsumption | None = None,
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
    if consumed is not None:
        manifest["consumed_dataset_events"] = [dict(e) for e in consumed.events]
        manifest["consumed_dataset_events_total"] = consumed.total
        manifest["consumed_dataset_ranges"] = {k: dict(v) for k, v in sorted(consumed.ranges.items())}
    return manifest
