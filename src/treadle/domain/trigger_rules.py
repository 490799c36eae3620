"""Trigger rules: when a task instance may run, given how its direct upstreams ended.

Pure: the engine counts the upstream ends it knows of (`UpstreamCounts`) and `evaluate` says
what to do with the waiting instance. The semantics are Airflow's:

- "failed" means an upstream ended `dead_letter` or `upstream_failed` (`cancelled` counts as
  failed too); "skipped" means it ended `skipped` (or a branch upstream chose other tasks);
  "done" is any of these or `success`.
- A rule that can no longer be met ends the instance without running it: `upstream_failed`
  when failures made it impossible, `skipped` when skips did (so a skip propagates through
  `all_success` tasks, and `none_failed` lets it through).
- `one_success` and `one_failed` fire as soon as one upstream qualifies; the others wait
  until every upstream is done, or until the rule cannot be met any more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from treadle.domain.states import TaskState


class TriggerRule(StrEnum):
    """When a task may run, given its direct upstreams (a task setting, `trigger_rule=`)."""

    ALL_SUCCESS = "all_success"
    ALL_DONE = "all_done"
    ALL_FAILED = "all_failed"
    ONE_SUCCESS = "one_success"
    ONE_FAILED = "one_failed"
    NONE_FAILED = "none_failed"
    NONE_FAILED_MIN_ONE_SUCCESS = "none_failed_min_one_success"
    ALWAYS = "always"


#: The rule of a task that names none: run once every upstream succeeded.
DEFAULT_RULE = TriggerRule.ALL_SUCCESS


class Verdict(StrEnum):
    """What to do with a waiting task instance."""

    READY = "ready"
    WAIT = "wait"
    SKIP = "skip"
    UPSTREAM_FAILED = "upstream_failed"


class End(StrEnum):
    """How one upstream instance ended, as the rules see it."""

    SUCCESS = "success"
    FAILED = "failed"
    SKIPPED = "skipped"


#: Ended states that count as failed for the rules.
FAILED_STATES = frozenset(
    {TaskState.DEAD_LETTER.value, TaskState.UPSTREAM_FAILED.value, TaskState.CANCELLED.value}
)


def end_of(state: str) -> End | None:
    """How an upstream in `state` counts (None: it has not ended)."""
    if state == TaskState.SUCCESS.value:
        return End.SUCCESS
    if state == TaskState.SKIPPED.value:
        return End.SKIPPED
    if state in FAILED_STATES:
        return End.FAILED
    return None


@dataclass(frozen=True, slots=True)
class UpstreamCounts:
    """How a task instance's direct upstream instances ended so far, out of `total`."""

    success: int = 0
    failed: int = 0
    skipped: int = 0
    total: int = 0

    @property
    def done(self) -> int:
        """Upstreams that ended, whichever way."""
        return self.success + self.failed + self.skipped

    @staticmethod
    def of(ends: Iterable[End | None]) -> UpstreamCounts:
        """Count the ends of every upstream instance (None: still active)."""
        listed = list(ends)
        return UpstreamCounts(
            success=listed.count(End.SUCCESS),
            failed=listed.count(End.FAILED),
            skipped=listed.count(End.SKIPPED),
            total=len(listed),
        )


def evaluate(rule: TriggerRule, counts: UpstreamCounts) -> Verdict:
    """The verdict of `rule` on a waiting instance whose upstreams ended as `counts` says.

    An instance without upstreams is always ready (it is a root).
    """
    if counts.total == 0:
        return Verdict.READY
    return _RULES[rule](counts, counts.done >= counts.total)


def _when_done(all_done: bool) -> Verdict:
    return Verdict.READY if all_done else Verdict.WAIT


def _all_success(c: UpstreamCounts, all_done: bool) -> Verdict:
    if c.failed:
        return Verdict.UPSTREAM_FAILED
    return Verdict.SKIP if c.skipped else _when_done(all_done)


def _all_failed(c: UpstreamCounts, all_done: bool) -> Verdict:
    return Verdict.SKIP if c.success or c.skipped else _when_done(all_done)


def _one_success(c: UpstreamCounts, all_done: bool) -> Verdict:
    if c.success:
        return Verdict.READY
    if not all_done:
        return Verdict.WAIT
    return Verdict.UPSTREAM_FAILED if c.failed else Verdict.SKIP


def _one_failed(c: UpstreamCounts, all_done: bool) -> Verdict:
    if c.failed:
        return Verdict.READY
    return Verdict.SKIP if all_done else Verdict.WAIT


def _none_failed(c: UpstreamCounts, all_done: bool) -> Verdict:
    return Verdict.UPSTREAM_FAILED if c.failed else _when_done(all_done)


def _none_failed_min_one_success(c: UpstreamCounts, all_done: bool) -> Verdict:
    if c.failed:
        return Verdict.UPSTREAM_FAILED
    if not all_done:
        return Verdict.WAIT
    return Verdict.READY if c.success else Verdict.SKIP


_RULES: dict[TriggerRule, Callable[[UpstreamCounts, bool], Verdict]] = {
    TriggerRule.ALL_SUCCESS: _all_success,
    TriggerRule.ALL_DONE: lambda _c, all_done: _when_done(all_done),
    TriggerRule.ALL_FAILED: _all_failed,
    TriggerRule.ONE_SUCCESS: _one_success,
    TriggerRule.ONE_FAILED: _one_failed,
    TriggerRule.NONE_FAILED: _none_failed,
    TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS: _none_failed_min_one_success,
    TriggerRule.ALWAYS: lambda _c, _all_done: Verdict.READY,
}


def parse_rule(value: object) -> TriggerRule:
    """The rule named `value`; ValueError listing the rules for anything else."""
    try:
        return TriggerRule(value)  # type: ignore[arg-type]  # checked by the enum itself
    except ValueError:
        allowed = ", ".join(r.value for r in TriggerRule)
        raise ValueError(f"trigger_rule must be one of {allowed}; got {value!r}") from None
