"""Sensors (`@sensor`) and submit-then-poll tasks (`Deferred`): tasks that wait without a slot.

A sensor is a function called once per poke: truthy when its condition holds (the value, or a
`Ready`'s, becomes the result), falsy (or a `Waiting`) to wait. Between pokes the task instance
waits in the database (`up_for_reschedule`) and holds no worker slot::

    @sensor(poke_interval=60, timeout=6 * 3600)
    def landed(context):
        return Path("/data/in/orders.csv").exists()

A `Deferred` submits an external job once, stores the JSON handle `submit` returns, and polls it
with that handle on later, short attempts until `poll` says it ended. A failed job's exit code
is classified by the task's exit-code contract (`exit_codes=`)::

    class Train(Deferred):
        def submit(self, context): return {"job": api.start(...)}
        def poll(self, handle, context): return PollResult.running() if ... else PollResult.success()
        def cancel(self, handle): api.stop(handle["job"])

    @dag
    def pipeline():
        Train(task_id="train", poll_interval=30, timeout=3600) >> report()

Cancelling the task (or its run) and the sensor-style timeout call `cancel(handle)`: a timeout
in the attempt that noticed it; a cancellation through a worker serving the task's queue (the
scheduler and the CLI never run DAG code).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from treadle.authoring.context import Poke, TaskContext
from treadle.authoring.decorators import TaskFunction
from treadle.authoring.outcomes import TaskOutcome
from treadle.authoring.settings import TaskSettings, check_setting_names, resolve_settings
from treadle.authoring.specs import TaskNode, TaskOutput, check_identifier, current_dag
from treadle.domain.exit_codes import Disposition
from treadle.domain.sensing import DEFAULT_SENSOR_TIMEOUT_S, PokeKind, SensorSpec
from treadle.errors import DagDefinitionError

#: Key of the value a poke returns to the worker (the worker reads it; nothing else should).
POKE_KEY = "treadle_poke"
#: Largest serialized handle or sensor state kept between pokes.
MAX_HANDLE_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Waiting:
    """A sensor's "not yet": falsy; `state` is handed to the next poke as `context.poke.state`
    and `evidence` is recorded with this attempt. Both JSON."""

    state: Any = None
    evidence: Mapping[str, Any] | None = None

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Ready:
    """A sensor's "the condition holds": `value` becomes the result; `evidence` (checksum, row
    count, producer status, watermark...) is recorded with the attempt. Both JSON."""

    value: Any = None
    evidence: Mapping[str, Any] | None = None

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class PollResult:
    """What `Deferred.poll` saw: use the constructors."""

    status: str
    result: Any = None
    exit_code: int | None = None
    message: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def running(**evidence: Any) -> PollResult:
        """The job still runs: poll again after the poll interval."""
        return PollResult(status="running", evidence=evidence)

    @staticmethod
    def success(result: Any = None, **evidence: Any) -> PollResult:
        """The job finished well; `result` (JSON) becomes the task's result."""
        return PollResult(status="success", result=result, evidence=evidence)

    @staticmethod
    def failed(exit_code: int, message: str = "", **evidence: Any) -> PollResult:
        """The job ended with `exit_code`, classified by the task's exit-code contract."""
        return PollResult(status="failed", exit_code=exit_code, message=message, evidence=evidence)

    @staticmethod
    def unknown_commit(message: str = "", **evidence: Any) -> PollResult:
        """Nobody can tell whether the job committed its output: `needs_inspection`."""
        return PollResult(status="unknown_commit", message=message, evidence=evidence)


class JobFailed(TaskOutcome):
    """A submitted job ended badly: its disposition is its exit code's under the contract."""

    def __init__(self, message: str, *, exit_code: int, disposition: Disposition) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.disposition = disposition


def _seconds(where: str, name: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise DagDefinitionError(f"{where}: {name} must be seconds (a number) or a timedelta, got {value!r}")
    if seconds <= 0:
        raise DagDefinitionError(f"{where}: {name} must be > 0, got {value!r}")
    return seconds


def sensor_spec(
    where: str, *, kind: PokeKind, poke_interval: object, timeout: object, soft_fail: object, mode: object
) -> SensorSpec:
    """Validate a sensor's settings (every problem named with where it is)."""
    if mode != "reschedule":
        raise DagDefinitionError(
            f"{where}: mode must be 'reschedule' (a sensor holds no slot between pokes), got {mode!r}"
        )
    if not isinstance(soft_fail, bool):
        raise DagDefinitionError(f"{where}: soft_fail must be True or False, got {soft_fail!r}")
    interval = _seconds(where, "poke_interval", poke_interval)
    assert interval is not None
    return SensorSpec(
        kind=kind,
        poke_interval_s=interval,
        timeout_s=_seconds(where, "timeout", timeout, allow_none=True),
        soft_fail=soft_fail,
    )


def _checked_json(what: str, value: Any, *, limit: int = MAX_HANDLE_BYTES) -> Any:
    """`value` if it is strict JSON within `limit` bytes; NonRetryable-style failure otherwise."""
    try:
        size = len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise JobFailed(
            f"{what} is not strict JSON: {exc}", exit_code=1, disposition=Disposition.NON_RETRYABLE
        ) from None
    if size > limit:
        raise JobFailed(
            f"{what} is {size} bytes serialized; the limit is {limit}",
            exit_code=1,
            disposition=Disposition.NON_RETRYABLE,
        )
    return value


def _evidence(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return _checked_json("the evidence", dict(value)) if value else None


def wait_reply(state: Any, evidence: Mapping[str, Any] | None, *, submitted: bool = False) -> dict[str, Any]:
    """The value a poke returns to ask for another poke."""
    return {
        POKE_KEY: "wait",
        "state": _checked_json("the state kept between pokes", state),
        "evidence": _evidence(evidence),
        "submitted": submitted,
    }


def ready_reply(value: Any, evidence: Mapping[str, Any] | None) -> dict[str, Any]:
    """The value a poke returns when the wait is over."""
    return {POKE_KEY: "ready", "value": value, "evidence": _evidence(evidence)}


def timeout_reply(evidence: Mapping[str, Any] | None) -> dict[str, Any]:
    """The value a final poke returns when the condition still did not hold."""
    return {POKE_KEY: "timeout", "evidence": _evidence(evidence)}


def _poke_of(context: TaskContext) -> Poke:
    return context.poke if context.poke is not None else Poke()


def sensor_callable(fn: Callable[..., Any], *, takes_context: bool) -> Callable[..., Any]:
    """Wrap a sensor function: its answer becomes a poke reply the worker reads."""

    @functools.wraps(fn)
    def poke(*args: Any, context: TaskContext, **kwargs: Any) -> dict[str, Any]:
        answer = fn(*args, **({**kwargs, "context": context} if takes_context else kwargs))
        if isinstance(answer, Waiting) or not answer:
            evidence = answer.evidence if isinstance(answer, Waiting) else None
            if _poke_of(context).final:
                return timeout_reply(evidence)
            return wait_reply(answer.state if isinstance(answer, Waiting) else None, evidence)
        if isinstance(answer, Ready):
            return ready_reply(answer.value, answer.evidence)
        return ready_reply(None if answer is True else answer, None)

    return poke


class SensorFunction(TaskFunction):
    """A function decorated with `@sensor`: placed like a task, run as short pokes."""

    def __init__(
        self, fn: Callable[..., Any], task_id: str | None, settings: dict[str, Any], spec: SensorSpec
    ) -> None:
        super().__init__(fn, task_id, settings, ())
        self.spec = spec

    def _place(
        self, dag: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, map_arg: str | None = None
    ) -> TaskOutput:
        output = super()._place(dag, args, kwargs, map_arg=map_arg)
        node = dag.tasks[output.task_id]
        node.fn = sensor_callable(self.fn, takes_context=node.takes_context)
        node.takes_context = True
        node.sensor = self.spec
        return output


def sensor(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    poke_interval: float | timedelta = 60.0,
    timeout: float | timedelta | None = DEFAULT_SENSOR_TIMEOUT_S,
    mode: str = "reschedule",
    soft_fail: bool = False,
    task_id: str | None = None,
    **settings: Any,
) -> Any:
    """Declare a sensor: a task that pokes until its condition holds, holding no slot between pokes.

    `poke_interval`: seconds (or a timedelta) between pokes. `timeout`: how long after the first
    poke it may wait (None: forever); past it the task is dead-lettered `sensor_timeout`, or
    skipped with `soft_fail=True`. Pokes spend no retry; a poke that raises is an ordinary failure
    under the retry settings (`retries`, `retry_delay`...), which a sensor takes like `@task`
    (but `timeout`, which is the sensor's).
    """
    where = f"@sensor {task_id or (fn.__name__ if fn else '')}".strip()
    check_setting_names(settings, where)
    spec = sensor_spec(
        where,
        kind=PokeKind.SENSOR,
        poke_interval=poke_interval,
        timeout=timeout,
        soft_fail=soft_fail,
        mode=mode,
    )

    def wrap(f: Callable[..., Any]) -> SensorFunction:
        return SensorFunction(f, task_id, settings, spec)

    return wrap(fn) if fn is not None else wrap


class Deferred(TaskOutput):
    """A submit-then-poll task: subclass it, implement `submit`, `poll` and `cancel`, and
    construct it inside a `@dag` function to place it (it then works as the task's output).

    `submit(context)` starts the external job and returns a JSON handle; `poll(handle, context)`
    returns a `PollResult`; `cancel(handle)` stops the job (called on cancellation and timeout;
    it must tolerate a job that already ended). `poll_interval` and `timeout` (from the submit)
    work as a sensor's; other settings as `@task`'s (`exit_codes` classifies a failed job's
    exit code; `retries` resubmit after a retryable failure).
    """

    def __init__(
        self,
        *,
        task_id: str | None = None,
        poll_interval: float | timedelta = 60.0,
        timeout: float | timedelta | None = DEFAULT_SENSOR_TIMEOUT_S,
        soft_fail: bool = False,
        depends_on: Sequence[str] = (),
        **settings: Any,
    ) -> None:
        dag = current_dag()
        base = task_id or _snake(type(self).__name__)
        where = f"{type(self).__name__} {base!r}"
        check_setting_names(settings, where)
        spec = sensor_spec(
            where,
            kind=PokeKind.DEFERRED,
            poke_interval=poll_interval,
            timeout=timeout,
            soft_fail=soft_fail,
            mode="reschedule",
        )
        if dag is None:  # built outside a DAG (a unit test of submit / poll): placed nowhere
            self.settings: TaskSettings = resolve_settings({}, settings, where)
            super().__init__(None, base)  # type: ignore[arg-type]  # no DAG to chain in
            return
        check_identifier("task id", base)
        if task_id is not None and base in dag.tasks:
            raise DagDefinitionError(f"dag {dag.dag_id!r}: duplicate task id {base!r}")
        the_id = dag.unique_task_id(base)
        self.settings = resolve_settings(dag.default_args, settings, f"dag {dag.dag_id!r} task {the_id!r}")
        node = TaskNode(
            task_id=the_id,
            fn=functools.partial(_run_deferred, self),
            settings=self.settings,
            args=(),
            kwargs={},
            takes_context=True,
            doc=inspect.getdoc(type(self)) or "",
            sensor=spec,
        )
        dag.add_task(node)
        for up in depends_on:
            dag.add_edge(up, the_id)
        super().__init__(dag, the_id)

    def submit(self, context: TaskContext) -> Any:
        """Start the job; return its handle (JSON), kept for `poll` and `cancel`."""
        raise NotImplementedError(f"{type(self).__name__} must implement submit(context)")

    def poll(self, handle: Any, context: TaskContext) -> PollResult:
        """Look at the job: running, success(result), failed(exit_code) or unknown_commit."""
        raise NotImplementedError(f"{type(self).__name__} must implement poll(handle, context)")

    def cancel(self, handle: Any) -> None:
        """Stop the job (idempotent: it may have ended already)."""
        raise NotImplementedError(f"{type(self).__name__} must implement cancel(handle)")


def deferred_of(fn: Callable[..., Any]) -> Deferred | None:
    """The submit-then-poll job a task node runs (None for any other task)."""
    if isinstance(fn, functools.partial) and fn.func is _run_deferred and isinstance(fn.args[0], Deferred):
        return fn.args[0]
    return None


def _snake(name: str) -> str:
    out = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return out or "job"


def _run_deferred(job: Deferred, *, context: TaskContext) -> dict[str, Any]:
    """One attempt of a submit-then-poll task: submit if no job is known, else poll it."""
    poke = _poke_of(context)
    if poke.state is None:
        handle = _checked_json("the handle submit returned", job.submit(context))
        if handle is None:
            raise JobFailed("submit returned no handle", exit_code=1, disposition=Disposition.NON_RETRYABLE)
        return wait_reply(handle, {"submitted": handle}, submitted=True)
    result = job.poll(poke.state, context)
    if not isinstance(result, PollResult):
        raise JobFailed(
            f"poll returned {result!r:.80}, not a PollResult",
            exit_code=1,
            disposition=Disposition.NON_RETRYABLE,
        )
    if result.status == "running":
        if poke.final:
            job.cancel(poke.state)
            return timeout_reply({**result.evidence, "cancelled": True})
        return wait_reply(poke.state, result.evidence or None)
    if result.status == "success":
        return ready_reply(result.result, result.evidence or None)
    if result.status == "unknown_commit":
        raise JobFailed(
            result.message or "the job's output may be partly committed",
            exit_code=60,
            disposition=Disposition.UNKNOWN_COMMIT,
        )
    code = result.exit_code if result.exit_code is not None else 1
    disposition = job.settings.exit_contract.classify(code)
    if disposition is Disposition.SUCCESS:
        return ready_reply(None, result.evidence or None)
    raise JobFailed(
        f"the job exited with code {code}: {disposition.value.replace('_', ' ')} under its exit-code "
        f"contract ({job.settings.exit_contract.describe()})"
        + (f"; {result.message}" if result.message else ""),
        exit_code=code if 0 < code <= 255 else 1,
        disposition=disposition,
    )
