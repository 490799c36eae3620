"""The OpenLineage sink: each lineage entry becomes the openlineage-python client's `RunEvent`
(its Run, Job, InputDataset, OutputDataset and ParentRunFacet classes), serialised by the
client's `Serde`, then POSTed as JSON to TREADLE_OPENLINEAGE_URL (the full endpoint, e.g.
Marquez's `http://marquez:5000/api/v1/lineage`; kept-alive connections, delivery/http.py, and any
2xx is a delivery) or appended as one line to TREADLE_OPENLINEAGE_FILE. Datasets are named in the
configured namespace.

Delivery is at least once (the outbox's): receivers may see an event twice, with the same run id
and event time.

openlineage-python comes with the `lineage` extra; without it the sink refuses to start with a
ConfigError naming the extra.
"""

from __future__ import annotations

import threading
from importlib.metadata import version as _version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.delivery.http import KeepAlivePoster
from treadle.domain.outbox import OutboxEntry, OutboxKind
from treadle.engine.lineage import SINK
from treadle.errors import ConfigError

if TYPE_CHECKING:
    from openlineage.client.event_v2 import RunEvent

__all__ = ["PRODUCER", "SINK", "OpenLineageSink", "require_client", "to_run_event"]

#: The `producer` of every event: the software that made it, with its version (a URN: a URI that
#: names treadle without pointing at a host).
PRODUCER = f"urn:treadle:{_version('treadle')}"


def require_client() -> None:
    """ConfigError naming the extra when openlineage-python is not installed."""
    try:
        import openlineage.client  # noqa: F401
    except ImportError:
        raise ConfigError(
            "TREADLE_OPENLINEAGE_URL or TREADLE_OPENLINEAGE_FILE is set, but the OpenLineage client "
            "is not installed: pip install 'treadle[lineage]' (openlineage-python)"
        ) from None


def to_run_event(payload: dict[str, Any]) -> RunEvent:  # Any: the stored JSON
    """The client's event of one stored lineage payload (domain/lineage.py)."""
    from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
    from openlineage.client.facet_v2 import parent_run

    namespace = payload["namespace"]
    facets: dict[str, Any] = {}
    parent = payload.get("parent")
    if parent:
        facets["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=parent["runId"]),
            job=parent_run.Job(namespace=namespace, name=parent["job"]),
        )
    return RunEvent(
        eventType=RunState(payload["eventType"]),
        eventTime=payload["eventTime"],
        run=Run(runId=payload["runId"], facets=facets),
        job=Job(namespace=namespace, name=payload["job"]),
        producer=PRODUCER,
        inputs=[InputDataset(namespace=namespace, name=name) for name in payload["inputs"]],
        outputs=[OutputDataset(namespace=namespace, name=name) for name in payload["outputs"]],
    )


class OpenLineageSink:
    """Sends lineage entries to `url` (HTTP) or appends them to `file` (one of the two)."""

    def __init__(self, *, url: str | None, file: Path | None, ack_s: float) -> None:
        if (url is None) == (file is None):
            raise ValueError("OpenLineageSink needs exactly one of url and file")
        require_client()
        self.url, self.file = url, file
        self.poster = KeepAlivePoster(url, ack_s=ack_s, name="OpenLineage") if url is not None else None
        self.lock = threading.Lock()

    def deliver(self, entry: OutboxEntry) -> str | None:
        """Send one event; None when it was taken, else what went wrong."""
        if entry.kind != OutboxKind.LINEAGE.value:
            return f"the OpenLineage sink takes {OutboxKind.LINEAGE.value} entries, not {entry.kind}"
        from openlineage.client.serde import Serde

        try:
            body = Serde.to_json(to_run_event(entry.payload))
        except (KeyError, TypeError, ValueError) as exc:
            return f"malformed lineage entry: {type(exc).__name__}: {exc}"[:2000]
        if self.poster is not None:
            return self.poster.post(body.encode(), {"Content-Type": "application/json"})
        assert self.file is not None
        try:
            with self.lock, self.file.open("a", encoding="utf-8") as out:
                out.write(body + "\n")
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"[:2000]
        return None

    def close(self) -> None:
        """Close the kept-alive connections."""
        if self.poster is not None:
            self.poster.close()
