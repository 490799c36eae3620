"""Validation of per-task settings (retries, delays, timeout, queue, callbacks)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from treadle.authoring.datasets import Dataset, dataset_names
from treadle.domain.exit_codes import PLAIN_EXIT_CONTRACT, ExitContract
from treadle.domain.identifiers import is_identifier
from treadle.domain.retry import RetryPolicy
from treadle.domain.trigger_rules import DEFAULT_RULE, TriggerRule, parse_rule
from treadle.errors import DagDefinitionError

TASK_SETTINGS = (
    "retries",
    "retry_delay",
    "backoff_factor",
    "max_retry_delay",
    "jitter",
    "timeout",
    "queue",
    "priority_weight",
    "pool",
    "pool_slots",
    "queue_timeout",
    "on_retry",
    "on_dead_letter",
    "outlets",
    "exit_codes",
    "trigger_rule",
    "max_map_length",
    "max_active_mapped",
)

Callback = Callable[..., Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSettings:
    """Validated settings of one task."""

    retry: RetryPolicy
    timeout_s: float | None
    queue: str
    priority_weight: int
    pool: str | None
    pool_slots: int
    queue_timeout_s: float | None
    on_retry: Callback | None
    on_dead_letter: Callback | None
    #: Names of the datasets the task produces: each success records an event on each.
    outlets: tuple[str, ...] = ()
    #: What each exit code (or `sys.exit` code of a Python task) means.
    exit_contract: ExitContract = field(default_factory=ExitContract)
    #: When it may run, given how its upstreams ended (domain/trigger_rules.py).
    trigger_rule: TriggerRule = DEFAULT_RULE
    #: Mapped placements: most elements (None: TREADLE_MAX_MAP_LENGTH), most instances active at once.
    max_map_length: int | None = None
    max_active_mapped: int | None = None


def _seconds(name: str, value: object, *, allow_zero: bool) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise DagDefinitionError(f"{name} must be seconds (a number) or a timedelta, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise DagDefinitionError(f"{name} must be {'>=' if allow_zero else '>'} 0, got {value!r}")
    return seconds


def _check_int(name: str, value: object, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise DagDefinitionError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_callback(name: str, value: object) -> Callback | None:
    if value is not None and not callable(value):
        raise DagDefinitionError(f"{name} must be callable, got {value!r}")
    return value


def _policy(merged: Mapping[str, Any], where: str) -> RetryPolicy:
    backoff = merged.get("backoff_factor", 2.0)
    if not isinstance(backoff, int | float) or isinstance(backoff, bool) or backoff < 1:
        raise DagDefinitionError(f"{where}: backoff_factor must be a number >= 1, got {backoff!r}")
    jitter = merged.get("jitter", 0.1)
    if not isinstance(jitter, int | float) or isinstance(jitter, bool) or not 0 <= jitter <= 1:
        raise DagDefinitionError(f"{where}: jitter must be a number in [0, 1], got {jitter!r}")
    return RetryPolicy(
        retries=_check_int(f"{where}: retries", merged.get("retries", 0), minimum=0),
        retry_delay_s=_seconds(f"{where}: retry_delay", merged.get("retry_delay", 30.0), allow_zero=True),
        backoff_factor=float(backoff),
        max_retry_delay_s=_seconds(
            f"{where}: max_retry_delay", merged.get("max_retry_delay", 3600.0), allow_zero=False
        ),
        jitter=float(jitter),
    )


def check_setting_names(settings: Mapping[str, Any], where: str) -> None:
    """Raise DagDefinitionError naming any setting that treadle does not know."""
    unknown = sorted(set(settings) - set(TASK_SETTINGS))
    if unknown:
        raise DagDefinitionError(
            f"{where}: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(TASK_SETTINGS)}"
        )


def resolve_settings(defaults: Mapping[str, Any], overrides: Mapping[str, Any], where: str) -> TaskSettings:
    """Merge DAG defaults with a task's own settings and validate every value."""
    check_setting_names(overrides, where)
    merged = {**defaults, **{k: v for k, v in overrides.items() if v is not None}}
    timeout = merged.get("timeout")
    queue = merged.get("queue", "default")
    if not isinstance(queue, str) or not is_identifier(queue):
        raise DagDefinitionError(f"{where}: queue must match [A-Za-z0-9._-]{{1,250}}, got {queue!r}")
    priority = merged.get("priority_weight", 1)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise DagDefinitionError(f"{where}: priority_weight must be an integer, got {priority!r}")
    pool = merged.get("pool")
    if pool is not None and (not isinstance(pool, str) or not is_identifier(pool)):
        raise DagDefinitionError(f"{where}: pool must match [A-Za-z0-9._-]{{1,250}}, got {pool!r}")
    queue_timeout = merged.get("queue_timeout")
    return TaskSettings(
        pool=pool,
        pool_slots=_check_int(f"{where}: pool_slots", merged.get("pool_slots", 1), minimum=1),
        queue_timeout_s=None
        if queue_timeout is None
        else _seconds(f"{where}: queue_timeout", queue_timeout, allow_zero=False),
        retry=_policy(merged, where),
        timeout_s=None if timeout is None else _seconds(f"{where}: timeout", timeout, allow_zero=False),
        queue=queue,
        priority_weight=priority,
        on_retry=_check_callback(f"{where}: on_retry", merged.get("on_retry")),
        on_dead_letter=_check_callback(f"{where}: on_dead_letter", merged.get("on_dead_letter")),
        outlets=_outlets(merged.get("outlets"), where),
        trigger_rule=_trigger_rule(merged.get("trigger_rule", DEFAULT_RULE.value), where),
        max_map_length=_optional_int(f"{where}: max_map_length", merged.get("max_map_length")),
        max_active_mapped=_optional_int(f"{where}: max_active_mapped", merged.get("max_active_mapped")),
        exit_contract=exit_contract(merged.get("exit_codes"), where),
    )


def exit_contract(value: object, where: str) -> ExitContract:
    """The contract an `exit_codes=` setting describes: an ExitContract, "standard", or a mapping
    with the lists success / retryable / non_retryable / unknown_commit and a default."""
    if value is None:
        return PLAIN_EXIT_CONTRACT
    if isinstance(value, ExitContract):
        return value
    if value == "standard":
        return ExitContract.standard()
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"success", "retryable", "non_retryable", "unknown_commit", "default"})
        if unknown:
            raise DagDefinitionError(
                f"{where}: exit_codes has unknown key(s) {', '.join(map(str, unknown))}; allowed: success, "
                "retryable, non_retryable, unknown_commit, default"
            )
        try:
            return ExitContract.from_json(value)
        except (TypeError, ValueError) as exc:
            raise DagDefinitionError(f"{where}: exit_codes: {exc}") from None
    raise DagDefinitionError(
        f'{where}: exit_codes must be an ExitContract, "standard" or a mapping of code lists, got {value!r}'
    )


def _trigger_rule(value: object, where: str) -> TriggerRule:
    try:
        return parse_rule(value)
    except ValueError as exc:
        raise DagDefinitionError(f"{where}: {exc}") from None


def _optional_int(name: str, value: object) -> int | None:
    return None if value is None else _check_int(name, value, minimum=1)


def _outlets(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise DagDefinitionError(f"{where}: outlets must be a list of Dataset, got {value!r}")
    for d in value:
        if isinstance(d, Dataset) and d.has_slo:
            raise DagDefinitionError(
                f"{where}: outlets: dataset {d.name!r} declares a freshness SLO; declare it where the "
                f"DAG lists its outputs: @dag(outlets=[Dataset({d.name!r}, ...)])"
            )
    return dataset_names(value, f"{where}: outlets")
