"""Cross-field rules on a DAG's params, checked beside its JSON Schema (pure: data, no user code).

A DAG declares them with `param_rules=[ParamRule.ordered("from_date", "to_date"), ...]`. They are
stored in the DAG version's structure, so the scheduler and the CLI check them at every trigger
without importing DAG code. A rule says nothing about a param that is absent or null (whether it
is required is the schema's business) nor about one the schema already rejected.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from treadle.errors import DagDefinitionError

#: What a param name looks like (as in `params=`).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")

#: (param name, message): one broken rule, reported at that param's path.
RuleViolation = tuple[str, str]

#: Values that can be put in order: ("number", float) or ("time", datetime).
_Orderable = tuple[str, Any]


class ParamRule(ABC):
    """A rule between a DAG's params. Build one with `ParamRule.ordered`, `ParamRule.max_range`
    or `ParamRule.requires`."""

    __slots__ = ()

    #: The rule's name in the stored JSON.
    kind: ClassVar[str]

    @staticmethod
    def ordered(first: str, second: str, *, strict: bool = False) -> ParamRule:
        """`first` must not come after `second` (before it, when `strict`).

        Both are numbers, or both ISO-8601 dates or times ("2026-07-01", "2026-07-01T06:00:00Z").
        """
        return Ordered(first=first, second=second, strict=strict)

    @staticmethod
    def max_range(
        start: str, end: str, *, days: float = 0, hours: float = 0, minutes: float = 0
    ) -> ParamRule:
        """From `start` to `end` (ISO-8601 dates or times) is at most the given span."""
        span = timedelta(days=days, hours=hours, minutes=minutes).total_seconds()
        return MaxRange(start=start, end=end, max_s=span)

    @staticmethod
    def requires(when: str, equals: Any, *required: str) -> ParamRule:
        """When param `when` equals `equals`, every param in `required` must be given (not empty).

        `ParamRule.requires("mode", "BACKFILL", "reason")`: a BACKFILL mode needs a reason.
        """
        return Requires(when=when, equals=equals, required=tuple(required))

    @abstractmethod
    def names(self) -> tuple[str, ...]:
        """The params the rule reads."""

    @abstractmethod
    def check(self, params: Mapping[str, Any], *, hidden: frozenset[str]) -> list[RuleViolation]:
        """The ways `params` break the rule; values of `hidden` (secret) params are never quoted."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in the DAG version."""

    @abstractmethod
    def describe(self) -> str:
        """The rule in a few words, e.g. "from_date <= to_date"."""

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ParamRule:
        """Build a rule from its JSON form; DagDefinitionError for one this code does not know."""
        kind = data.get("rule")
        if kind == Ordered.kind:
            return Ordered(first=data["first"], second=data["second"], strict=bool(data.get("strict")))
        if kind == MaxRange.kind:
            return MaxRange(start=data["start"], end=data["end"], max_s=float(data["max_s"]))
        if kind == Requires.kind:
            return Requires(when=data["when"], equals=data.get("equals"), required=tuple(data["required"]))
        raise DagDefinitionError(f"unknown param rule {kind!r}; known: ordered, max_range, requires")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ordered(ParamRule):
    """`first` <= `second` (< when strict)."""

    kind: ClassVar[str] = "ordered"
    first: str
    second: str
    strict: bool = False

    def __post_init__(self) -> None:
        _check_names("ParamRule.ordered", (self.first, self.second), distinct=True)
        if not isinstance(self.strict, bool):
            raise DagDefinitionError(f"ParamRule.ordered: strict must be True or False, got {self.strict!r}")

    def names(self) -> tuple[str, ...]:
        """The two params compared."""
        return self.first, self.second

    def check(self, params: Mapping[str, Any], *, hidden: frozenset[str]) -> list[RuleViolation]:
        """A violation at `second` when it comes before `first` (or equals it, when strict)."""
        pair = _pair(params, self.first, self.second, need_time=False)
        if pair is None:
            return []
        if isinstance(pair, str):
            return [(self.second, pair)]
        (kind, a), (_, b) = pair
        if b > a or (b == a and not self.strict):
            return []
        if kind == "time":
            words = "after" if self.strict else "on or after"
        else:
            words = "greater than" if self.strict else "at least"
        shown = _shown(params, (self.first, self.second), hidden)
        return [(self.second, f"must be {words} {self.first!r}{shown}")]

    def to_json(self) -> dict[str, Any]:
        """{"rule": "ordered", "first", "second", "strict"}."""
        return {"rule": self.kind, "first": self.first, "second": self.second, "strict": self.strict}

    def describe(self) -> str:
        """ "a <= b" or "a < b"."""
        return f"{self.first} {'<' if self.strict else '<='} {self.second}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MaxRange(ParamRule):
    """`end` - `start` <= `max_s` seconds, for dates and times."""

    kind: ClassVar[str] = "max_range"
    start: str
    end: str
    max_s: float

    def __post_init__(self) -> None:
        _check_names("ParamRule.max_range", (self.start, self.end), distinct=True)
        if isinstance(self.max_s, bool) or not isinstance(self.max_s, int | float) or not self.max_s > 0:
            raise DagDefinitionError(
                "ParamRule.max_range needs a span greater than zero (days=, hours= or minutes=)"
            )

    def names(self) -> tuple[str, ...]:
        """The two ends of the range."""
        return self.start, self.end

    def check(self, params: Mapping[str, Any], *, hidden: frozenset[str]) -> list[RuleViolation]:
        """A violation at `end` when the range is longer than allowed."""
        pair = _pair(params, self.start, self.end, need_time=True)
        if pair is None:
            return []
        if isinstance(pair, str):
            return [(self.end, pair)]
        (_, a), (_, b) = pair
        span = (b - a).total_seconds()
        if span <= self.max_s:
            return []
        length = "" if hidden & {self.start, self.end} else f"{_span(span)}, "
        return [
            (
                self.end,
                f"the range from {self.start!r} to {self.end!r} is {length}longer than the "
                f"{_span(self.max_s)} allowed",
            )
        ]

    def to_json(self) -> dict[str, Any]:
        """{"rule": "max_range", "start", "end", "max_s"}."""
        return {"rule": self.kind, "start": self.start, "end": self.end, "max_s": float(self.max_s)}

    def describe(self) -> str:
        """ "to - from <= 31 days"."""
        return f"{self.end} - {self.start} <= {_span(self.max_s)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Requires(ParamRule):
    """When `when` equals `equals`, each of `required` must be given."""

    kind: ClassVar[str] = "requires"
    when: str
    equals: Any  # Any: a JSON value
    required: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_names("ParamRule.requires", (self.when, *self.required), distinct=True)
        if not self.required:
            raise DagDefinitionError("ParamRule.requires needs at least one param that becomes required")
        try:
            json.dumps(self.equals)
        except (TypeError, ValueError):
            raise DagDefinitionError(
                f"ParamRule.requires: the value of {self.when!r} to match must be JSON, got {self.equals!r}"
            ) from None

    def names(self) -> tuple[str, ...]:
        """The condition's param, then the required ones."""
        return self.when, *self.required

    def check(self, params: Mapping[str, Any], *, hidden: frozenset[str]) -> list[RuleViolation]:
        """A violation at each required param that is missing, null or empty text."""
        if self.when not in params or not _same_json(params[self.when], self.equals):
            return []
        condition = f"{self.when!r} is {json.dumps(self.equals)}"
        return [
            (name, f"required when {condition}")
            for name in self.required
            if params.get(name) is None or params.get(name) == ""
        ]

    def to_json(self) -> dict[str, Any]:
        """{"rule": "requires", "when", "equals", "required"}."""
        return {"rule": self.kind, "when": self.when, "equals": self.equals, "required": list(self.required)}

    def describe(self) -> str:
        """ "reason required when mode = "BACKFILL""."""
        return f"{', '.join(self.required)} required when {self.when} = {json.dumps(self.equals)}"


def check_rules(
    rules: tuple[ParamRule, ...] | list[ParamRule],
    params: Mapping[str, Any],
    *,
    hidden: frozenset[str] = frozenset(),
    rejected: frozenset[str] = frozenset(),
) -> list[RuleViolation]:
    """Every violation of every rule; rules reading a param in `rejected` (the schema already
    reported it) are left out, so one bad value is not reported twice."""
    found: list[RuleViolation] = []
    for rule in rules:
        if rejected.intersection(rule.names()):
            continue
        found.extend(rule.check(params, hidden=hidden))
    return found


def _check_names(where: str, names: tuple[object, ...], *, distinct: bool) -> None:
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise DagDefinitionError(
                f"{where}: {name!r} is not a param name (1-100 letters, digits or underscores, "
                "not starting with a digit)"
            )
    if distinct and len(set(names)) != len(names):
        raise DagDefinitionError(f"{where}: names a param twice ({', '.join(map(str, names))})")


def _orderable(value: Any, *, need_time: bool) -> _Orderable | None:
    """("number", x) or ("time", datetime) for a value that can be put in order, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and not need_time:
        return "number", float(value)
    if isinstance(value, str):
        try:
            return "time", datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def _pair(
    params: Mapping[str, Any], first: str, second: str, *, need_time: bool
) -> tuple[_Orderable, _Orderable] | str | None:
    """Both values put in order; None when one is absent; a message when they cannot be compared."""
    a, b = params.get(first), params.get(second)
    if a is None or b is None:
        return None
    x, y = _orderable(a, need_time=need_time), _orderable(b, need_time=need_time)
    forms = "ISO-8601 dates or times" if need_time else "numbers or both ISO-8601 dates or times"
    if x is None or y is None or x[0] != y[0]:
        return f"cannot be compared with {first!r}: both must be {forms}"
    if x[0] == "time" and (x[1].tzinfo is None) != (y[1].tzinfo is None):
        return f"cannot be compared with {first!r}: one has a time zone and the other has none"
    return x, y


def _shown(params: Mapping[str, Any], names: tuple[str, str], hidden: frozenset[str]) -> str:
    """ " (2026-07-01 and 2026-06-01)", or nothing when a secret value is involved."""
    if hidden.intersection(names):
        return ""
    return f" ({json.dumps(params[names[0]])}), got {json.dumps(params[names[1]])}"


def _span(seconds: float) -> str:
    """2678400 -> "31 days", 5400 -> "1.5 hours", 90 -> "1.5 minutes"."""
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size:
            amount = seconds / size
            return f"{amount:g} {unit}{'' if amount == 1 else 's'}"
    return f"{seconds:g} seconds"


def _same_json(a: Any, b: Any) -> bool:
    """Equality of JSON values that tells true from 1 (Python's == does not)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
