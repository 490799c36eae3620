"""Quality gates: a task that checks data and stops the pipeline when a blocking check fails.

    from treadle import Check, quality_gate

    @quality_gate(outlets=[Dataset("warehouse.orders")])
    def orders_quality(staged: dict) -> list[Check]:
        return [
            Check("row_count", passed=staged["rows"] > 0, observed=staged["rows"], expected="> 0"),
            Check("late_rows", passed=staged["late"] < 10, severity="WARN", observed=staged["late"],
                  expected="< 10"),
        ]

The gate's result is a quality result, `{"state": "passed" | "warn" | "failed", "checks": [...]}`,
stored with the attempt (`outputs["quality"]`) and, on success, as the task's result. A failed
BLOCKER check fails the gate at once, never retried (the same data fails the same way; exit
code 40, quality precheck), so a publish task downstream never runs. A failed WARN check is only
recorded. The gate's outlets record a dataset event carrying the quality state: `passed` or
`warn` on success, `failed` when a blocker failed. A failed-quality event does not move the
dataset's newest event, so dataset-triggered consumers never start on a failed version.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from treadle.authoring.context import TaskContext
from treadle.authoring.decorators import TaskFunction
from treadle.authoring.outcomes import NonRetryable
from treadle.authoring.settings import check_setting_names
from treadle.domain.exit_codes import QUALITY_PRECHECK_FAILED

#: Largest serialized quality result kept with an attempt.
MAX_QUALITY_RESULT_BYTES = 32 * 1024


class Severity(StrEnum):
    """How much a failed check matters."""

    BLOCKER = "BLOCKER"
    WARN = "WARN"


@dataclass(frozen=True, slots=True)
class Check:
    """One quality check: its name, whether it passed, and what was observed against what was
    expected (any JSON values, shown to people)."""

    name: str
    passed: bool
    severity: Severity | str = Severity.BLOCKER
    observed: Any = None
    expected: Any = None
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        """The stored form (severity validated)."""
        try:
            severity = Severity(str(self.severity).upper())
        except ValueError:
            raise ValueError(
                f"check {self.name!r}: severity must be BLOCKER or WARN, got {self.severity!r}"
            ) from None
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a check needs a non-empty name, got {self.name!r}")
        return {
            "name": self.name,
            "severity": severity.value,
            "passed": bool(self.passed),
            "observed": self.observed,
            "expected": self.expected,
            "message": self.message,
        }


class QualityGateFailed(NonRetryable):
    """A BLOCKER check of a quality gate failed (never retried: the same data fails again)."""

    default_exit_code = QUALITY_PRECHECK_FAILED


def evaluate(returned: object) -> dict[str, Any]:
    """The quality result of what a gate function returned: a list of Check (or mappings with
    the same fields). Raises ValueError naming the problem for anything else."""
    if isinstance(returned, Check | Mapping):
        returned = [returned]
    if not isinstance(returned, Sequence) or isinstance(returned, str | bytes):
        raise ValueError(f"a quality gate must return a list of Check, got {type(returned).__name__}")
    checks = []
    for item in returned:
        if isinstance(item, Mapping):
            unknown = sorted(set(item) - {"name", "passed", "severity", "observed", "expected", "message"})
            if unknown or "name" not in item or "passed" not in item:
                raise ValueError(
                    f"a check must have name and passed (and optionally severity, observed, expected, "
                    f"message), got keys {sorted(item)}"
                )
            item = Check(**item)
        if not isinstance(item, Check):
            raise ValueError(f"a quality gate must return Check objects, got {type(item).__name__}")
        checks.append(item.to_json())
    names = [c["name"] for c in checks]
    if len(set(names)) != len(names):
        raise ValueError(f"check names must be unique, got {names}")
    failed = [c for c in checks if not c["passed"]]
    state = (
        "failed"
        if any(c["severity"] == Severity.BLOCKER for c in failed)
        else ("warn" if failed else "passed")
    )
    result = {"state": state, "checks": checks}
    size = len(json.dumps(result, default=str))
    if size > MAX_QUALITY_RESULT_BYTES:
        raise ValueError(f"the quality result is {size} bytes; the limit is {MAX_QUALITY_RESULT_BYTES}")
    as_json: dict[str, Any] = json.loads(json.dumps(result, default=str))  # observed/expected as JSON
    return as_json


def _describe(check: Mapping[str, Any]) -> str:
    return f"{check['name']} (observed {check['observed']!r}, expected {check['expected']!r})"


def _gate(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a gate function: evaluate its checks, fail on a blocker, annotate the outlets."""
    signature = inspect.signature(fn)
    wants_context = "context" in signature.parameters

    @functools.wraps(fn)
    def run(*args: Any, context: TaskContext | None = None, **kwargs: Any) -> dict[str, Any]:
        returned = fn(*args, **kwargs, **({"context": context} if wants_context else {}))
        try:
            result = evaluate(returned)
        except ValueError as exc:
            raise NonRetryable(f"quality gate: {exc}", exit_code=QUALITY_PRECHECK_FAILED) from None
        if context is not None:
            for name in context.outlets:
                context.outlet_event(name, metadata={"quality": result["state"]})
        if result["state"] == "failed":
            blockers = [c for c in result["checks"] if not c["passed"] and c["severity"] == Severity.BLOCKER]
            raise QualityGateFailed(
                "quality gate failed: " + "; ".join(_describe(c) for c in blockers),
                outputs={"quality": result},
            )
        return result

    if not wants_context:
        params = [*signature.parameters.values()]
        extra = inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, default=None)
        keep = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
        tail = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        run.__signature__ = signature.replace(parameters=[*keep, extra, *tail])  # type: ignore[attr-defined]
    return run


def quality_gate(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    task_id: str | None = None,
    depends_on: Sequence[str] = (),
    **settings: Any,
) -> TaskFunction | Callable[[Callable[..., Any]], TaskFunction]:
    """Declare a quality gate: a task whose function returns a list of `Check` (see the module
    docstring). Takes the settings of `@task`; retries apply only to errors the function raises,
    never to failed checks."""
    check_setting_names(settings, f"@quality_gate {task_id or (fn.__name__ if fn else '')}".strip())

    def wrap(f: Callable[..., Any]) -> TaskFunction:
        return TaskFunction(_gate(f), task_id, settings, depends_on)

    return wrap(fn) if fn is not None else wrap
