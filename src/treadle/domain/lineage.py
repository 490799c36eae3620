"""OpenLineage events of runs and task attempts, as the JSON the outbox stores.

Pure: the engine writes these payloads with the state change that causes them; the relay's
OpenLineage sink turns each into the client's `RunEvent` (delivery/lineage.py). A run is the
job `<dag_id>`, a task attempt the job `<dag_id>.<task_id>` whose parent is its run; run ids are
UUIDs derived from treadle's ids (stable: a redelivered event names the same run).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

#: The namespace of the derived run UUIDs (any fixed UUID; never change it).
_IDS = uuid.UUID("6f1c3c1e-2f4b-4c57-9a3e-2b7d1f0a9c41")


class LineageEventType(StrEnum):
    """The OpenLineage run states treadle reports."""

    START = "START"
    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    ABORT = "ABORT"


def run_uuid(run_id: str) -> str:
    """The OpenLineage run id of a treadle run."""
    return str(uuid.uuid5(_IDS, run_id))


def attempt_uuid(run_id: str, task_id: str, map_index: int, attempt: int) -> str:
    """The OpenLineage run id of one task attempt."""
    return str(uuid.uuid5(_IDS, f"{run_id}/{task_id}/{map_index}/{attempt}"))


def run_event(
    *,
    event_type: LineageEventType,
    at: datetime,
    namespace: str,
    dag_id: str,
    run_id: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
) -> dict[str, Any]:
    """The payload of a run's event."""
    return {
        "eventType": event_type.value,
        "eventTime": at.isoformat(),
        "namespace": namespace,
        "job": dag_id,
        "runId": run_uuid(run_id),
        "treadle_run_id": run_id,
        "parent": None,
        "inputs": sorted(inputs),
        "outputs": sorted(outputs),
    }


def task_event(
    *,
    event_type: LineageEventType,
    at: datetime,
    namespace: str,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int,
    attempt: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
) -> dict[str, Any]:
    """The payload of a task attempt's event; its parent is the run."""
    return {
        "eventType": event_type.value,
        "eventTime": at.isoformat(),
        "namespace": namespace,
        "job": f"{dag_id}.{task_id}",
        "runId": attempt_uuid(run_id, task_id, map_index, attempt),
        "treadle_run_id": run_id,
        "parent": {"job": dag_id, "runId": run_uuid(run_id)},
        "inputs": sorted(inputs),
        "outputs": sorted(outputs),
    }
