"""Trigger rules: the verdict of every rule on every kind of upstream outcome (a truth table)."""

from __future__ import annotations

import pytest

from treadle.domain.states import TaskState
from treadle.domain.trigger_rules import (
    End,
    TriggerRule,
    UpstreamCounts,
    Verdict,
    end_of,
    evaluate,
    parse_rule,
)

R, W, S, F = Verdict.READY, Verdict.WAIT, Verdict.SKIP, Verdict.UPSTREAM_FAILED

RULES = (
    "all_success",
    "all_done",
    "all_failed",
    "one_success",
    "one_failed",
    "none_failed",
    "none_failed_min_one_success",
    "always",
)

# (success, failed, skipped) out of 3 upstreams -> the verdict of each rule, in RULES order.
TABLE = {
    (0, 0, 0): (W, W, W, W, W, W, W, R),
    (1, 0, 0): (W, W, S, R, W, W, W, R),
    (0, 1, 0): (F, W, W, W, R, F, F, R),
    (0, 0, 1): (S, W, S, W, W, W, W, R),
    (3, 0, 0): (R, R, S, R, S, R, R, R),
    (0, 3, 0): (F, R, R, F, R, F, F, R),
    (0, 0, 3): (S, R, S, S, S, R, S, R),
    (2, 1, 0): (F, R, S, R, R, F, F, R),
    (2, 0, 1): (S, R, S, R, S, R, R, R),
    (0, 2, 1): (F, R, S, F, R, F, F, R),
    (1, 1, 1): (F, R, S, R, R, F, F, R),
    (1, 1, 0): (F, W, S, R, R, F, F, R),
    (0, 1, 1): (F, W, S, W, R, F, F, R),
}


@pytest.mark.parametrize(("ends", "expected"), sorted(TABLE.items()))
def test_every_rule_on_every_mix_of_upstream_ends(
    ends: tuple[int, int, int], expected: tuple[Verdict, ...]
) -> None:
    success, failed, skipped = ends
    counts = UpstreamCounts(success=success, failed=failed, skipped=skipped, total=3)
    got = tuple(evaluate(TriggerRule(rule), counts) for rule in RULES)
    assert dict(zip(RULES, got, strict=True)) == dict(zip(RULES, expected, strict=True))


def test_the_table_names_every_rule() -> None:
    assert {r.value for r in TriggerRule} == set(RULES)


@pytest.mark.parametrize("rule", RULES)
def test_a_task_without_upstreams_is_ready_whatever_its_rule(rule: str) -> None:
    assert evaluate(TriggerRule(rule), UpstreamCounts()) is Verdict.READY


def test_how_each_ended_state_counts() -> None:
    assert end_of(TaskState.SUCCESS.value) is End.SUCCESS
    assert end_of(TaskState.SKIPPED.value) is End.SKIPPED
    for state in (TaskState.DEAD_LETTER, TaskState.UPSTREAM_FAILED, TaskState.CANCELLED):
        assert end_of(state.value) is End.FAILED
    for state in (TaskState.PENDING, TaskState.QUEUED, TaskState.RUNNING, TaskState.RETRY_WAIT):
        assert end_of(state.value) is None
    counts = UpstreamCounts.of([End.SUCCESS, None, End.FAILED, End.SKIPPED, End.SUCCESS])
    assert counts == UpstreamCounts(success=2, failed=1, skipped=1, total=5)
    assert counts.done == 4


def test_an_unknown_rule_is_refused_with_the_list_of_rules() -> None:
    assert parse_rule("one_failed") is TriggerRule.ONE_FAILED
    with pytest.raises(ValueError, match=r"trigger_rule must be one of all_success, all_done, .*; got 'any'"):
        parse_rule("any")
