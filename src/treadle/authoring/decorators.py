"""`@dag` and `@task`: build DAGs from plain Python functions."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, overload

from treadle.authoring.commands import command_spec
from treadle.authoring.contract import build_contract, check_param_rules, check_structure_contract
from treadle.authoring.datasets import Dataset, dataset_names
from treadle.authoring.params import build_params_schema
from treadle.authoring.settings import TASK_SETTINGS, check_setting_names, resolve_settings
from treadle.authoring.specs import (
    Dag,
    TaskNode,
    TaskOutput,
    building,
    check_identifier,
    current_dag,
    literal_arg,
)
from treadle.domain.alerts import AlertRule
from treadle.domain.commands import CommandSpec
from treadle.domain.dag_version import DEFAULT_TEAM, ArgRef
from treadle.domain.param_rules import ParamRule
from treadle.domain.timetable import ScheduleSpec, parse_schedule
from treadle.errors import DagDefinitionError


class TaskFunction:
    """A function decorated with `@task`.

    Called inside a `@dag` function it places a task and returns its `TaskOutput`;
    called anywhere else it simply runs the function (handy in unit tests).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        task_id: str | None,
        settings: dict[str, Any],
        depends_on: Sequence[str],
        *,
        branch: bool = False,
        command: CommandSpec | None = None,
    ) -> None:
        self.fn = fn
        #: Set for `@task.command`: the function returns the argv of the program to run.
        self.command = command
        self.task_id = task_id
        self.settings = settings
        self.depends_on = tuple(depends_on)
        self.branch = branch
        self.signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dag = current_dag()
        if dag is None:
            return self.fn(*args, **kwargs)
        return self._place(dag, args, kwargs)

    def partial(self, **kwargs: Any) -> PartialTask:
        """Fix the arguments every mapped instance shares: `f.partial(k=v).expand(item=up())`."""
        return PartialTask(self, kwargs)

    def expand(self, **mapped: Any) -> TaskOutput:
        """Place a mapped task: one instance per element of an upstream task's list.

        `mapped` is one keyword argument whose value is a task's output (a list when it runs);
        each instance gets one element as that argument. Arguments shared by every instance go
        through `partial`. Downstream tasks receive the instances' results as one list in order.
        """
        return PartialTask(self, {}).expand(**mapped)

    def _place(
        self, dag: Dag, args: tuple[Any, ...], kwargs: dict[str, Any], *, map_arg: str | None = None
    ) -> TaskOutput:
        base = check_identifier("task id", self.task_id or self.fn.__name__)
        if self.task_id is not None and base in dag.tasks:
            raise DagDefinitionError(f"dag {dag.dag_id!r}: duplicate task id {base!r}")
        task_id = dag.unique_task_id(base)
        where = f"dag {dag.dag_id!r} task {task_id!r}"
        takes_context = "context" in self.signature.parameters
        try:
            bound_kwargs = {**kwargs, "context": None} if takes_context else kwargs
            self.signature.bind(*args, **bound_kwargs)
        except TypeError as exc:
            raise DagDefinitionError(f"{where}: {exc}") from exc
        upstream: set[str] = set()

        def ref(value: Any) -> ArgRef:
            if isinstance(value, TaskOutput):
                upstream.add(value.task_id)
                return ArgRef(upstream=value.task_id)
            return literal_arg(where, value)

        node = TaskNode(
            task_id=task_id,
            fn=self.fn,
            settings=resolve_settings(dag.default_args, self.settings, where),
            args=tuple(ref(a) for a in args),
            kwargs={k: ref(v) for k, v in kwargs.items()},
            takes_context=takes_context,
            upstream=upstream,
            doc=inspect.getdoc(self.fn) or "",
            branch=self.branch,
            map_arg=map_arg,
            command=self.command,
        )
        dag.add_task(node)
        for up in self.depends_on:
            dag.add_edge(up, task_id)
        return TaskOutput(dag, task_id)


class PartialTask:
    """A task function with the arguments its mapped instances share (`TaskFunction.partial`)."""

    def __init__(self, function: TaskFunction, shared: dict[str, Any]) -> None:
        self.function = function
        self.shared = shared

    def expand(self, **mapped: Any) -> TaskOutput:
        """Place the mapped task (see `TaskFunction.expand`)."""
        fn = self.function
        where = f"{fn.task_id or fn.fn.__name__}.expand"
        dag = current_dag()
        if dag is None:
            raise DagDefinitionError(f"{where}: a mapped task is placed inside a @dag function")
        if len(mapped) != 1:
            raise DagDefinitionError(
                f"{where} takes exactly one keyword argument, the list to map over "
                f"(got {', '.join(sorted(mapped)) or 'none'}); pass shared arguments with .partial()"
            )
        ((name, source),) = mapped.items()
        if not isinstance(source, TaskOutput):
            raise DagDefinitionError(
                f"{where}: {name}= must be the output of a task call, whose list result is "
                f"expanded (e.g. process.expand({name}=discover())); got {source!r:.80}"
            )
        if fn.branch:
            raise DagDefinitionError(f"{where}: a branch task cannot be mapped")
        if name in self.shared:
            raise DagDefinitionError(f"{where}: {name!r} is given both to partial() and to expand()")
        return fn._place(dag, (), {**self.shared, name: source}, map_arg=name)


def _decorate(
    fn: Callable[..., Any] | None,
    task_id: str | None,
    depends_on: Sequence[str],
    settings: dict[str, Any],
    *,
    branch: bool,
) -> TaskFunction | Callable[[Callable[..., Any]], TaskFunction]:
    check_setting_names(settings, f"@task {task_id or (fn.__name__ if fn else '')}".strip())

    def wrap(f: Callable[..., Any]) -> TaskFunction:
        return TaskFunction(f, task_id, settings, depends_on, branch=branch)

    return wrap(fn) if fn is not None else wrap


class TaskDecorator:
    """`@task`, `@task.branch` and `@task.command` (the object `treadle.task` is)."""

    @overload
    def __call__(self, fn: Callable[..., Any], /) -> TaskFunction: ...
    @overload
    def __call__(
        self, /, *, task_id: str | None = None, depends_on: Sequence[str] = (), **settings: Any
    ) -> Callable[[Callable[..., Any]], TaskFunction]: ...

    def __call__(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        task_id: str | None = None,
        depends_on: Sequence[str] = (),
        **settings: Any,
    ) -> TaskFunction | Callable[[Callable[..., Any]], TaskFunction]:
        """Declare a task.

        Settings: retries, retry_delay (seconds or timedelta), backoff_factor, max_retry_delay,
        jitter (0..1), timeout, queue, priority_weight, pool, pool_slots, queue_timeout,
        on_retry, on_dead_letter, outlets (datasets each success records an event on),
        trigger_rule (when it runs given how its upstreams ended: all_success, the default,
        all_done, all_failed, one_success, one_failed, none_failed,
        none_failed_min_one_success, always), and for mapped placements (`.expand`)
        max_map_length and max_active_mapped.
        `depends_on` names upstream task ids for dependencies that carry no data.
        """
        return _decorate(fn, task_id, depends_on, settings, branch=False)

    @overload
    def branch(self, fn: Callable[..., Any], /) -> TaskFunction: ...
    @overload
    def branch(
        self, /, *, task_id: str | None = None, depends_on: Sequence[str] = (), **settings: Any
    ) -> Callable[[Callable[..., Any]], TaskFunction]: ...

    def branch(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        task_id: str | None = None,
        depends_on: Sequence[str] = (),
        **settings: Any,
    ) -> TaskFunction | Callable[[Callable[..., Any]], TaskFunction]:
        """Declare a branch task: it returns the id (or a list of ids, or None for none) of the
        direct downstream tasks to run; the other direct downstream tasks are skipped, and the
        skip travels on by their trigger rules. An id that is not a direct downstream fails the
        task without retries. Settings as for `@task`."""
        return _decorate(fn, task_id, depends_on, settings, branch=True)

    @overload
    def command(self, fn: Callable[..., Any], /) -> TaskFunction: ...
    @overload
    def command(
        self,
        /,
        *,
        task_id: str | None = None,
        depends_on: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        allowed: Sequence[str] | None = None,
        shell: bool = False,
        manifest_arg: bool = True,
        **settings: Any,
    ) -> Callable[[Callable[..., Any]], TaskFunction]: ...

    def command(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        task_id: str | None = None,
        depends_on: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        allowed: Sequence[str] | None = None,
        shell: bool = False,
        manifest_arg: bool = True,
        **settings: Any,
    ) -> TaskFunction | Callable[[Callable[..., Any]], TaskFunction]:
        """Declare a command task whose function returns the program's argv (a list of strings;
        one string with `shell=True`). The function takes upstream results and `context` like a
        `@task`; the program then runs as a `CommandTask` does (see treadle.authoring.commands).
        """
        name = f"@task.command {task_id or (fn.__name__ if fn else '')}".strip()
        check_setting_names(settings, name)
        spec = command_spec(name, env=env, cwd=cwd, allowed=allowed, shell=shell, manifest_arg=manifest_arg)

        def wrap(f: Callable[..., Any]) -> TaskFunction:
            return TaskFunction(f, task_id, settings, depends_on, command=spec)

        return wrap(fn) if fn is not None else wrap


#: `@task` declares a Python task, `@task.branch` a branch task, `@task.command` a command task.
task = TaskDecorator()


def dag(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    dag_id: str | None = None,
    owner: str = "treadle",
    description: str | None = None,
    tags: Sequence[str] = (),
    schedule: str | timedelta | float | Sequence[Dataset | str] | None = None,
    timezone: str = "UTC",
    start_date: datetime | str | None = None,
    end_date: datetime | str | None = None,
    catchup: bool = False,
    max_active_runs: int = 16,
    dst_gap: str = "shift",
    dst_overlap: str = "first",
    params: Mapping[str, Any] | None = None,
    allow_extra_params: bool = False,
    default_args: dict[str, Any] | None = None,
    max_active_tasks: int | None = None,
    param_rules: Sequence[ParamRule] = (),
    purpose: str = "",
    criticality: str | None = None,
    inlets: Sequence[Dataset | str] = (),
    outlets: Sequence[Dataset | str] = (),
    freshness_slo: timedelta | float | str | None = None,
    failure_impact: str = "",
    runbook_url: str | None = None,
    manual_runs: bool = True,
    backfills: bool = True,
    published_by: str | None = None,
    alerts: Sequence[AlertRule] = (),
    team: str = DEFAULT_TEAM,
) -> Any:
    """Declare a DAG: the decorated function places tasks; the decorator returns the `Dag`.

    `schedule`: None (runs only when triggered), a cron expression read in `timezone`
    ("0 2 * * *"), a preset ("@hourly", "@daily", "@weekly", "@monthly", "@yearly"), a fixed
    interval (timedelta or seconds), or a list of `Dataset`s (runs once each has a new event).
    A scheduled run covers the data interval between two fire times and fires at its end; its
    logical date is the interval's start. `start_date`/`end_date` bound the logical dates;
    `catchup=True` creates the runs of intervals missed while paused or down (oldest first),
    otherwise only the latest. `max_active_runs` caps scheduled runs active at once.
    `dst_gap` ("shift"|"skip") and `dst_overlap` ("first"|"both") override the daylight-saving
    policy for fixed-hour cron entries.
    `params`: name -> `Param` (or a plain default) validated as JSON Schema at every trigger;
    unknown conf keys are rejected unless `allow_extra_params`. A DAG that declares no params
    has nothing to check a conf against: it takes any conf object as given (every key passes).
    `max_active_tasks` caps how many of its task instances run at once, across all its runs.
    `param_rules`: cross-field `ParamRule`s checked with the params at every trigger.

    The contract (all optional, shown by `treadle dags show`): `purpose`; `criticality` (low,
    medium, high, critical); `inlets` and `outlets`, the datasets it reads and writes (its outputs
    also include every task's outlets, its inputs the datasets it is scheduled on);
    `freshness_slo`, how old its outputs may get (timedelta, seconds or text such as "6h");
    `failure_impact`; `runbook_url` (http or https); `manual_runs=False` refuses manual triggers
    and `backfills=False` refuses backfills; `published_by`, a daily deadline for a new
    version of its outputs ("06:00 Asia/Jakarta"); `alerts`, its `Alert(...)` rules (a kind
    declared here replaces the deployment's TREADLE_ALERT_RULES of that kind for this DAG).

    `team`: the team that owns the DAG (roles in the REST API are granted per team).

    Calling the decorated name (`my_dag()`, as in Airflow) returns the same DAG: it is built once.
    """

    def build(f: Callable[..., Any]) -> Dag:
        the_id = check_identifier("dag id", dag_id or f.__name__)
        where = f"dag {the_id!r}"
        spec: ScheduleSpec | None
        try:
            plain: str | timedelta | float | Sequence[str] | None = (
                dataset_names(schedule, f"{where}: schedule")
                if isinstance(schedule, list | tuple)
                else schedule  # type: ignore[assignment]  # a str, number, timedelta or None
            )
            spec = parse_schedule(
                plain,
                timezone=timezone,
                start_date=start_date,
                end_date=end_date,
                catchup=catchup,
                max_active_runs=max_active_runs,
                dst_gap=dst_gap,
                dst_overlap=dst_overlap,
            )
        except ValueError as exc:
            raise DagDefinitionError(f"{where}: {exc}") from exc
        params_schema = build_params_schema(params, allow_extra=allow_extra_params, where=where)
        if spec is not None and params_schema and params_schema.get("required"):
            raise DagDefinitionError(
                f"{where}: scheduled runs take the params' defaults, but "
                f"{', '.join(params_schema['required'])} ha(s) none"
            )
        defaults = dict(default_args or {})
        unknown = sorted(set(defaults) - set(TASK_SETTINGS))
        if unknown:
            raise DagDefinitionError(
                f"dag {the_id!r}: unknown default_args {', '.join(unknown)}; "
                f"allowed: {', '.join(TASK_SETTINGS)}"
            )
        resolve_settings(defaults, {}, f"dag {the_id!r} default_args")
        if max_active_tasks is not None and (
            not isinstance(max_active_tasks, int)
            or isinstance(max_active_tasks, bool)
            or max_active_tasks < 1
        ):
            raise DagDefinitionError(f"dag {the_id!r}: max_active_tasks must be an integer >= 1")
        contract = build_contract(
            where,
            purpose=purpose,
            criticality=criticality,
            inlets=inlets,
            outlets=outlets,
            freshness_slo=freshness_slo,
            failure_impact=failure_impact,
            runbook_url=runbook_url,
            manual_runs=manual_runs,
            backfills=backfills,
            published_by=published_by,
            alerts=alerts,
        )
        rules = check_param_rules(param_rules, params_schema, where)
        new = Dag(
            dag_id=the_id,
            owner=owner,
            description=description if description is not None else (inspect.getdoc(f) or ""),
            tags=tuple(tags),
            schedule=spec,
            params_schema=params_schema,
            default_args=defaults,
            fileloc=inspect.getsourcefile(f) or "",
            max_active_tasks=max_active_tasks,
            contract=contract,
            param_rules=rules,
            team=check_identifier("team", team),
        )
        with building(new):
            f()
            new.validate()
            check_structure_contract(new.structure(), where)
        return new

    return build(fn) if fn is not None else build
