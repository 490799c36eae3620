"""The context a running task receives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from treadle.authoring.artifacts import Artifacts
from treadle.authoring.datasets import Dataset

#: Longest version string an outlet event keeps (the `dataset_events.version` column).
MAX_OUTLET_VERSION_CHARS = 250
#: Largest serialized metadata of one outlet event; past it the attempt fails, not retried.
MAX_OUTLET_METADATA_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Poke:
    """What the current poke knows of the earlier ones (`context.poke`)."""

    #: What the last poke left: a sensor's `Waiting.state`, or a submitted job's handle.
    #: None on the first poke. Any: JSON.
    state: Any = None
    #: This poke starts at or past the timeout: a condition still unmet ends the wait.
    final: bool = False
    #: Database time of the first poke (None on the first).
    first_poke_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskContext:
    """What a task knows about the attempt it runs in.

    A task function receives it when it declares a parameter named `context`.
    """

    run_id: str
    dag_id: str
    task_id: str
    logical_date: datetime
    #: 1-based number of this attempt of the task instance.
    attempt: int
    #: The run's params: the trigger's conf validated by the DAG's schema, defaults applied.
    #: Any: user JSON.
    params: dict[str, Any] = field(default_factory=dict)
    #: The run manifest (run id, DAG version hash, logical date, data interval, run type and
    #: mode, params, who asked and when). Any: JSON.
    manifest: dict[str, Any] = field(default_factory=dict)
    #: The manifest as a JSON file (also in the environment as TREADLE_MANIFEST_FILE) for
    #: commands the task starts; None outside a worker.
    manifest_path: str | None = None
    #: Results of upstream tasks by task id (a mapped upstream's: the list of its instances'
    #: results; a mapped instance does not get the list it maps over). Any: user JSON.
    upstream_results: dict[str, Any] = field(default_factory=dict)
    #: Names of the datasets this task declares as outlets (`@task(outlets=[...])`).
    outlets: tuple[str, ...] = ()
    #: Annotations of this attempt's outlet events by dataset name: {"version": str | None,
    #: "metadata": dict}, filled by `outlet_event`. Any: user JSON.
    outlet_events: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Position of this instance in the list a mapped task maps over (its element is the mapped
    #: argument); -1 for a task that is not mapped.
    map_index: int = -1
    #: Sensors and submit-then-poll tasks: what the earlier pokes left (None for other tasks).
    poke: Poke | None = None

    @property
    def artifacts(self) -> Artifacts:
        """This task's artifacts: files handed downstream by URI (authoring/artifacts.py)."""
        return Artifacts.from_env(run_id=self.run_id, task_id=self.task_id)

    def outlet_event(
        self,
        dataset: Dataset | str,
        *,
        version: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Give the event this attempt records on `dataset` when it succeeds a version and metadata.

        Only declared outlets can be annotated (ValueError otherwise); a second call for the same
        dataset replaces the first. `metadata` must be a JSON object of at most
        MAX_OUTLET_METADATA_BYTES serialized: beyond it the attempt fails without retries.
        """
        name = dataset.name if isinstance(dataset, Dataset) else dataset
        if not isinstance(name, str) or name not in self.outlets:
            declared = ", ".join(self.outlets) if self.outlets else "none"
            raise ValueError(
                f"task {self.task_id!r} does not declare dataset {name!r} as an outlet "
                f"(declared outlets: {declared})"
            )
        if version is not None and (
            not isinstance(version, str) or not 1 <= len(version) <= MAX_OUTLET_VERSION_CHARS
        ):
            raise ValueError(
                f"outlet event version must be a string of 1-{MAX_OUTLET_VERSION_CHARS} characters, "
                f"got {version!r:.80}"
            )
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValueError(f"outlet event metadata must be a mapping (JSON object), got {metadata!r:.80}")
        self.outlet_events[name] = {"version": version, "metadata": dict(metadata or {})}
