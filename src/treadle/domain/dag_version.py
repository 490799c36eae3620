"""Serialized DAG structure (what `dag_versions` stores) and its content hash."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from treadle.domain.contract import DagContract
from treadle.domain.exit_codes import PLAIN_EXIT_CONTRACT, ExitContract
from treadle.domain.graph import downstream_map, transitive_downstream
from treadle.domain.param_rules import ParamRule
from treadle.domain.retry import RetryPolicy
from treadle.domain.sensing import SensorSpec
from treadle.domain.timetable import ScheduleSpec

#: JSON values as stored (Any only at this serialization boundary).
JSON = Any
#: The team a DAG belongs to unless it names one.
DEFAULT_TEAM = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgRef:
    """One argument of a task call: a literal JSON value or the result of an upstream task."""

    upstream: str | None = None
    literal: JSON = None

    def to_json(self) -> dict[str, JSON]:
        """Return the JSON form."""
        if self.upstream is not None:
            return {"upstream": self.upstream}
        return {"literal": self.literal}

    @staticmethod
    def from_json(data: dict[str, JSON]) -> ArgRef:
        """Build from the JSON form."""
        if "upstream" in data:
            return ArgRef(upstream=str(data["upstream"]))
        return ArgRef(literal=data.get("literal"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskDef:
    """Serialized definition of one task."""

    task_id: str
    upstream: tuple[str, ...] = ()
    args: tuple[ArgRef, ...] = ()
    kwargs: dict[str, ArgRef] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_s: float | None = None
    queue: str = "default"
    priority_weight: int = 1
    pool: str | None = None
    pool_slots: int = 1
    #: None: the deployment's default queue timeout applies.
    queue_timeout_s: float | None = None
    has_on_retry: bool = False
    has_on_dead_letter: bool = False
    #: Datasets the task produces (an event on each at every success).
    outlets: tuple[str, ...] = ()
    doc: str = ""
    #: What each exit code means (written only when not the default, as every later field).
    exit_contract: ExitContract = field(default_factory=ExitContract)
    #: When it may run, given how its upstreams ended (domain/trigger_rules.py).
    trigger_rule: str = "all_success"
    #: A branch task: its result names the direct downstream tasks to run; the others are skipped.
    branch: bool = False
    #: A mapped task: the keyword argument whose upstream list is expanded, one instance per element.
    map_arg: str | None = None
    #: Most elements it may map over (None: the deployment's TREADLE_MAX_MAP_LENGTH).
    max_map_length: int | None = None
    #: Most of its mapped instances queued or running at once (None: no bound).
    max_active_mapped: int | None = None
    #: A command task's program (domain/commands.py `CommandSpec.to_json`); None: a Python task.
    command: dict[str, JSON] | None = None
    #: Set for sensors and submit-then-poll tasks: they wait between pokes holding no slot.
    sensor: SensorSpec | None = None

    def to_json(self) -> dict[str, JSON]:
        """Return the JSON form (settings added since the first version only when set, so the
        version hash of a DAG that does not use them stays what it was)."""
        r = self.retry
        data = self._base_json(r)
        if not self.exit_contract.is_default:
            data["exit_contract"] = self.exit_contract.to_json()
        if self.command is not None:
            data["command"] = self.command
        if self.sensor is not None:
            data["sensor"] = self.sensor.to_json()
        return data

    def _base_json(self, r: RetryPolicy) -> dict[str, JSON]:
        return {
            "task_id": self.task_id,
            "upstream": list(self.upstream),
            "args": [a.to_json() for a in self.args],
            "kwargs": {k: v.to_json() for k, v in sorted(self.kwargs.items())},
            "retries": r.retries,
            "retry_delay_s": r.retry_delay_s,
            "backoff_factor": r.backoff_factor,
            "max_retry_delay_s": r.max_retry_delay_s,
            "jitter": r.jitter,
            "timeout_s": self.timeout_s,
            "queue": self.queue,
            "priority_weight": self.priority_weight,
            "pool": self.pool,
            "pool_slots": self.pool_slots,
            "queue_timeout_s": self.queue_timeout_s,
            "has_on_retry": self.has_on_retry,
            "has_on_dead_letter": self.has_on_dead_letter,
            "outlets": list(self.outlets),
            "doc": self.doc,
            **self._newer_json(),
        }

    def _newer_json(self) -> dict[str, JSON]:
        newer: dict[str, JSON] = {
            "trigger_rule": self.trigger_rule,
            "branch": self.branch,
            "map_arg": self.map_arg,
            "max_map_length": self.max_map_length,
            "max_active_mapped": self.max_active_mapped,
        }
        return {k: v for k, v in newer.items() if v != _NEWER_DEFAULTS[k]}

    @staticmethod
    def from_json(data: dict[str, JSON]) -> TaskDef:
        """Build from the JSON form."""
        return TaskDef(
            task_id=data["task_id"],
            upstream=tuple(data.get("upstream", ())),
            args=tuple(ArgRef.from_json(a) for a in data.get("args", ())),
            kwargs={k: ArgRef.from_json(v) for k, v in data.get("kwargs", {}).items()},
            retry=RetryPolicy(
                retries=int(data.get("retries", 0)),
                retry_delay_s=float(data.get("retry_delay_s", 30.0)),
                backoff_factor=float(data.get("backoff_factor", 2.0)),
                max_retry_delay_s=float(data.get("max_retry_delay_s", 3600.0)),
                jitter=float(data.get("jitter", 0.1)),
            ),
            timeout_s=data.get("timeout_s"),
            queue=data.get("queue", "default"),
            priority_weight=int(data.get("priority_weight", 1)),
            pool=data.get("pool"),
            pool_slots=int(data.get("pool_slots", 1)),
            queue_timeout_s=data.get("queue_timeout_s"),
            has_on_retry=bool(data.get("has_on_retry", False)),
            has_on_dead_letter=bool(data.get("has_on_dead_letter", False)),
            outlets=tuple(data.get("outlets", ())),
            doc=data.get("doc", ""),
            exit_contract=ExitContract.from_json(data["exit_contract"])
            if "exit_contract" in data
            else PLAIN_EXIT_CONTRACT,
            trigger_rule=data.get("trigger_rule", "all_success"),
            branch=bool(data.get("branch", False)),
            map_arg=data.get("map_arg"),
            max_map_length=data.get("max_map_length"),
            max_active_mapped=data.get("max_active_mapped"),
            command=data.get("command"),
            sensor=SensorSpec.from_json(data["sensor"]) if data.get("sensor") else None,
        )

    @property
    def is_mapped(self) -> bool:
        """True if it runs once per element of an upstream's list."""
        return self.map_arg is not None

    @property
    def map_source(self) -> str | None:
        """The upstream task whose list a mapped task expands."""
        if self.map_arg is None:
            return None
        return self.kwargs[self.map_arg].upstream


#: Defaults of the TaskDef fields written only when set (see TaskDef.to_json).
_NEWER_DEFAULTS: dict[str, JSON] = {
    "trigger_rule": "all_success",
    "branch": False,
    "map_arg": None,
    "max_map_length": None,
    "max_active_mapped": None,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DagStructure:
    """Serialized structure of one DAG: what the scheduler and API know of it."""

    dag_id: str
    owner: str = "treadle"
    description: str = ""
    tags: tuple[str, ...] = ()
    #: How runs are created by time or datasets; None: manual triggers only.
    schedule: ScheduleSpec | None = None
    #: JSON Schema of the run params; None: any conf is taken as the params.
    params_schema: dict[str, JSON] | None = None
    fileloc: str = ""
    #: Most task instances of this DAG running at once, across its runs (None: no limit).
    max_active_tasks: int | None = None
    tasks: dict[str, TaskDef] = field(default_factory=dict)
    #: Purpose, criticality, inputs and outputs, freshness, runbook, allowed kinds of runs.
    contract: DagContract = field(default_factory=DagContract)
    #: Cross-field rules on the params, checked with the params schema at every trigger.
    param_rules: tuple[ParamRule, ...] = ()
    #: The team that owns the DAG (written only when not the default, so older hashes hold).
    team: str = DEFAULT_TEAM

    def to_json(self) -> dict[str, JSON]:
        """Return the JSON form (keys sorted, so the hash is stable).

        The contract and the param rules are written only when declared, so the hash of a DAG
        that declares neither is what it was before they existed.
        """
        extra: dict[str, JSON] = {}
        if not self.contract.is_default:
            extra["contract"] = self.contract.to_json()
        if self.param_rules:
            extra["param_rules"] = [r.to_json() for r in self.param_rules]
        if self.team != DEFAULT_TEAM:
            extra["team"] = self.team
        return extra | {
            "dag_id": self.dag_id,
            "owner": self.owner,
            "description": self.description,
            "tags": sorted(self.tags),
            "schedule": self.schedule.to_json() if self.schedule else None,
            "params_schema": self.params_schema,
            "fileloc": self.fileloc,
            "max_active_tasks": self.max_active_tasks,
            "tasks": {k: t.to_json() for k, t in sorted(self.tasks.items())},
        }

    @staticmethod
    def from_json(data: dict[str, JSON]) -> DagStructure:
        """Build from the JSON form."""
        return DagStructure(
            dag_id=data["dag_id"],
            owner=data.get("owner", "treadle"),
            description=data.get("description", ""),
            tags=tuple(data.get("tags", ())),
            schedule=_schedule_from_json(json.dumps(data["schedule"], sort_keys=True))
            if data.get("schedule")
            else None,
            params_schema=data.get("params_schema"),
            fileloc=data.get("fileloc", ""),
            max_active_tasks=data.get("max_active_tasks"),
            tasks={k: TaskDef.from_json(v) for k, v in data.get("tasks", {}).items()},
            contract=DagContract.from_json(data.get("contract") or {}),
            param_rules=tuple(ParamRule.from_json(r) for r in data.get("param_rules") or ()),
            team=data.get("team", DEFAULT_TEAM),
        )

    def content_hash(self) -> str:
        """Return the sha256 of the canonical JSON form (the version identity)."""
        return content_digest(self.to_json())

    def inputs(self) -> tuple[str, ...]:
        """Datasets the DAG reads: its declared inlets and the datasets it is scheduled on."""
        scheduled = self.schedule.datasets if self.schedule is not None else ()
        return tuple(sorted({*self.contract.inlets, *scheduled}))

    def outputs(self) -> tuple[str, ...]:
        """Datasets the DAG writes: its declared outlets and every task's outlets."""
        produced = (name for t in self.tasks.values() for name in t.outlets)
        return tuple(sorted({*self.contract.outlets, *produced}))

    def upstream_map(self) -> dict[str, tuple[str, ...]]:
        """Return task id -> direct upstream ids."""
        return {k: t.upstream for k, t in self.tasks.items()}

    def downstream(self) -> dict[str, list[str]]:
        """Return task id -> direct downstream ids."""
        return downstream_map(self.upstream_map())

    def all_downstream(self, task_id: str) -> list[str]:
        """Return every task id transitively downstream of `task_id`."""
        return transitive_downstream(self.downstream(), task_id)


def content_digest(data: dict[str, JSON]) -> str:
    """The content hash of a structure's JSON form (`DagStructure.to_json`): the sha256 of its
    canonical text, for a caller that needs the form too and builds it once."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@functools.lru_cache(maxsize=4096)
def _schedule_from_json(text: str) -> ScheduleSpec:
    """Parse (and validate) a stored schedule once per distinct spec: many DAGs share one."""
    return ScheduleSpec.from_json(json.loads(text))


@dataclass(frozen=True, slots=True, kw_only=True)
class DagVersion:
    """A registered version: its structure plus the derived maps the hot path needs, computed once."""

    id: int
    structure: DagStructure
    version_hash: str
    downstream: dict[str, list[str]]

    @staticmethod
    def of(version_id: int, structure: DagStructure, *, version_hash: str | None = None) -> DagVersion:
        """Derive the downstream map (and the hash, unless the stored one is given) of a structure."""
        return DagVersion(
            id=version_id,
            structure=structure,
            version_hash=version_hash or structure.content_hash(),
            downstream=structure.downstream(),
        )

    def all_downstream(self, task_id: str) -> list[str]:
        """Return every task id transitively downstream of `task_id`."""
        return transitive_downstream(self.downstream, task_id)
