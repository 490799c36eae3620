"""In-memory DAG and task objects built by the decorators, and their serialization."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from treadle.authoring.settings import TaskSettings
from treadle.domain.commands import CommandSpec
from treadle.domain.contract import DagContract
from treadle.domain.dag_version import DEFAULT_TEAM, ArgRef, DagStructure, TaskDef
from treadle.domain.graph import find_cycle
from treadle.domain.identifiers import is_identifier
from treadle.domain.param_rules import ParamRule
from treadle.domain.sensing import SensorSpec
from treadle.domain.timetable import ScheduleSpec
from treadle.domain.trigger_rules import TriggerRule
from treadle.errors import DagDefinitionError

_building: ContextVar[Dag | None] = ContextVar("treadle_building_dag", default=None)
#: Every Dag built while a collector is installed is appended to it (used by the loader).
_collector: ContextVar[list[Dag] | None] = ContextVar("treadle_dag_collector", default=None)


@dataclass(slots=True)
class TaskNode:
    """One task placed in a DAG: its callable, settings, arguments and upstream ids."""

    task_id: str
    fn: Callable[..., Any]
    settings: TaskSettings
    args: tuple[ArgRef, ...]
    kwargs: dict[str, ArgRef]
    takes_context: bool
    upstream: set[str] = field(default_factory=set)
    doc: str = ""
    #: A branch task (`@task.branch`): its result names the direct downstream tasks to run.
    branch: bool = False
    #: A mapped placement (`.expand(name=upstream)`): the keyword argument expanded per element.
    map_arg: str | None = None
    #: Set for a command task: `fn` then returns its argv (or is not called: a fixed argv).
    command: CommandSpec | None = None
    #: Set for sensors and submit-then-poll tasks (`authoring/sensing.py`).
    sensor: SensorSpec | None = None

    def to_def(self) -> TaskDef:
        """Return the serialized definition."""
        s = self.settings
        return TaskDef(
            task_id=self.task_id,
            upstream=tuple(sorted(self.upstream)),
            args=self.args,
            kwargs=self.kwargs,
            retry=s.retry,
            timeout_s=s.timeout_s,
            queue=s.queue,
            priority_weight=s.priority_weight,
            pool=s.pool,
            pool_slots=s.pool_slots,
            queue_timeout_s=s.queue_timeout_s,
            has_on_retry=s.on_retry is not None,
            has_on_dead_letter=s.on_dead_letter is not None,
            outlets=s.outlets,
            doc=self.doc,
            exit_contract=s.exit_contract,
            trigger_rule=s.trigger_rule.value,
            branch=self.branch,
            map_arg=self.map_arg,
            max_map_length=s.max_map_length if self.map_arg else None,
            max_active_mapped=s.max_active_mapped if self.map_arg else None,
            command=None if self.command is None else self.command.to_json(),
            sensor=self.sensor,
        )


class TaskOutput:
    """The future result of a task in a DAG; pass it to another task or chain with `>>`."""

    def __init__(self, dag: Dag, task_id: str) -> None:
        self.dag = dag
        self.task_id = task_id

    def __rshift__(self, other: TaskOutput | list[TaskOutput]) -> TaskOutput | list[TaskOutput]:
        for o in other if isinstance(other, list) else [other]:
            self.dag.add_edge(self.task_id, o.task_id)
        return other

    def __lshift__(self, other: TaskOutput | list[TaskOutput]) -> TaskOutput | list[TaskOutput]:
        for o in other if isinstance(other, list) else [other]:
            self.dag.add_edge(o.task_id, self.task_id)
        return other

    def __rrshift__(self, other: list[TaskOutput]) -> TaskOutput:
        for o in other:
            self.dag.add_edge(o.task_id, self.task_id)
        return self

    def __repr__(self) -> str:
        return f"TaskOutput({self.dag.dag_id}.{self.task_id})"


@dataclass(slots=True)
class Dag:
    """A DAG: id, metadata, and the tasks placed in it."""

    dag_id: str
    owner: str = "treadle"
    description: str = ""
    tags: tuple[str, ...] = ()
    schedule: ScheduleSpec | None = None
    #: JSON Schema of the run params (None: the DAG takes any conf as its params).
    params_schema: dict[str, Any] | None = None
    default_args: dict[str, Any] = field(default_factory=dict)
    fileloc: str = ""
    max_active_tasks: int | None = None
    #: The team that owns the DAG: roles are granted per team.
    team: str = DEFAULT_TEAM
    tasks: dict[str, TaskNode] = field(default_factory=dict)
    contract: DagContract = field(default_factory=DagContract)
    param_rules: tuple[ParamRule, ...] = ()
    pending_edges: list[tuple[str, str]] = field(default_factory=list)
    #: Next suffix to try per base id, so calling one function N times costs O(N), not O(N^2).
    next_suffix: dict[str, int] = field(default_factory=dict)

    def __call__(self, *args: object, **kwargs: object) -> Dag:
        """Return this DAG: `@dag` built it already, so Airflow's `my_dag()` at the end of a DAG
        file defines nothing twice."""
        if args or kwargs:
            raise DagDefinitionError(
                f"dag {self.dag_id!r} is built once, when @dag decorates its function, and takes no "
                "arguments: declare run parameters with @dag(params=...) and pass values with "
                "`treadle dags trigger --conf`"
            )
        return self

    def add_task(self, node: TaskNode) -> None:
        """Place a task; its id must be new in this DAG."""
        if node.task_id in self.tasks:
            raise DagDefinitionError(f"dag {self.dag_id!r}: duplicate task id {node.task_id!r}")
        self.tasks[node.task_id] = node

    def add_edge(self, upstream: str, downstream: str) -> None:
        """Record that `downstream` runs after `upstream` (checked in validate())."""
        self.pending_edges.append((upstream, downstream))

    def unique_task_id(self, base: str) -> str:
        """Return `base`, or `base__N` when a function is called more than once in the DAG."""
        if base not in self.tasks:
            return base
        n = self.next_suffix.get(base, 1)
        while f"{base}__{n}" in self.tasks:
            n += 1
        self.next_suffix[base] = n + 1
        return f"{base}__{n}"

    def validate(self) -> None:
        """Apply edges and reject unknown task ids and cycles (naming the cycle)."""
        for up, down in self.pending_edges:
            for tid in (up, down):
                if tid not in self.tasks:
                    raise DagDefinitionError(
                        f"dag {self.dag_id!r}: unknown task id {tid!r} in dependency {up} >> {down}"
                    )
            self.tasks[down].upstream.add(up)
        self.pending_edges.clear()
        if not self.tasks:
            raise DagDefinitionError(f"dag {self.dag_id!r} has no tasks")
        cycle = find_cycle({k: t.upstream for k, t in self.tasks.items()})
        if cycle:
            raise DagDefinitionError(f"dag {self.dag_id!r} has a cycle: {' -> '.join(cycle)}")
        for node in self.tasks.values():
            if node.map_arg is not None and node.settings.trigger_rule is TriggerRule.ALWAYS:
                raise DagDefinitionError(
                    f"dag {self.dag_id!r} task {node.task_id!r}: a mapped task waits for the list it "
                    "maps over, so trigger_rule='always' cannot apply to it"
                )

    def structure(self) -> DagStructure:
        """Return the serialized structure stored in `dag_versions`."""
        return DagStructure(
            dag_id=self.dag_id,
            owner=self.owner,
            description=self.description,
            tags=self.tags,
            schedule=self.schedule,
            params_schema=self.params_schema,
            fileloc=self.fileloc,
            max_active_tasks=self.max_active_tasks,
            tasks={k: t.to_def() for k, t in self.tasks.items()},
            contract=self.contract,
            param_rules=self.param_rules,
            team=self.team,
        )


def downstream_of(dag: Dag, task_id: str) -> list[str]:
    """The ids of the tasks directly downstream of `task_id` (after `validate`)."""
    return sorted(k for k, t in dag.tasks.items() if task_id in t.upstream)


def current_dag() -> Dag | None:
    """Return the DAG being built, if any."""
    return _building.get()


@contextmanager
def building(dag: Dag) -> Iterator[Dag]:
    """Make `dag` the one that task calls place themselves in."""
    token = _building.set(dag)
    try:
        yield dag
    finally:
        _building.reset(token)
    collected = _collector.get()
    if collected is not None:
        collected.append(dag)


@contextmanager
def collecting() -> Iterator[list[Dag]]:
    """Collect every DAG built inside the block (the loader imports files inside one)."""
    bucket: list[Dag] = []
    token = _collector.set(bucket)
    try:
        yield bucket
    finally:
        _collector.reset(token)


def check_identifier(kind: str, value: object) -> str:
    """Return `value` if it is a valid identifier, else raise naming the rule."""
    if not isinstance(value, str) or not is_identifier(value):
        raise DagDefinitionError(f"{kind} {value!r} must match [A-Za-z0-9._-]{{1,250}}")
    return value


def literal_arg(where: str, value: object) -> ArgRef:
    """Wrap a literal argument, which must be JSON-serializable."""
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise DagDefinitionError(f"{where}: argument {value!r} is not JSON-serializable") from exc
    return ArgRef(literal=value)
