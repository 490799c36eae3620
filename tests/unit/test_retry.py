"""Retry policy: backoff growth, cap, jitter bounds, exhaustion and poison."""

from __future__ import annotations

import pytest

from treadle.domain.retry import RetryPolicy, decide_retry
from treadle.domain.states import DeadLetterReason

POLICY = RetryPolicy(retries=5, retry_delay_s=10, backoff_factor=2, max_retry_delay_s=60, jitter=0.2)


@pytest.mark.parametrize(("attempt", "base"), [(1, 10), (2, 20), (3, 40), (4, 60), (5, 60)])
def test_delay_grows_exponentially_and_is_capped(attempt: int, base: float) -> None:
    low, high = POLICY.delay_range(attempt)
    assert low == pytest.approx(base * 0.8)
    assert high == pytest.approx(min(base * 1.2, 60))


@pytest.mark.parametrize("rand", [0.0, 0.25, 0.5, 0.999])
def test_jittered_delay_stays_in_range(rand: float) -> None:
    for attempt in range(1, 6):
        low, high = POLICY.delay_range(attempt)
        assert low <= POLICY.delay_s(attempt, rand=rand) <= high


def test_jitter_spreads_delays() -> None:
    assert POLICY.delay_s(1, rand=0.0) < POLICY.delay_s(1, rand=0.99)


def test_retries_until_budget_is_spent() -> None:
    decisions = [
        decide_retry(POLICY, attempt_in_budget=n, orphaned_count=0, retryable=True, rand=0.5)
        for n in range(1, 7)
    ]
    assert [d.retry for d in decisions] == [True] * 5 + [False]
    assert decisions[-1].dead_letter_reason is DeadLetterReason.RETRIES_EXHAUSTED


def test_three_orphanings_make_a_poison_dead_letter_whatever_the_budget() -> None:
    decision = decide_retry(POLICY, attempt_in_budget=3, orphaned_count=3, retryable=True, rand=0.5)
    assert not decision.retry
    assert decision.dead_letter_reason is DeadLetterReason.POISON


def test_non_retryable_error_dead_letters_at_once() -> None:
    decision = decide_retry(POLICY, attempt_in_budget=1, orphaned_count=0, retryable=False, rand=0.5)
    assert decision.dead_letter_reason is DeadLetterReason.NON_RETRYABLE


def test_zero_retries_dead_letters_first_failure() -> None:
    decision = decide_retry(RetryPolicy(), attempt_in_budget=1, orphaned_count=0, retryable=True, rand=0)
    assert not decision.retry


def test_lost_attempts_never_spend_the_retry_budget() -> None:
    no_retries = RetryPolicy(retries=0, retry_delay_s=1)
    lost = decide_retry(
        no_retries, attempt_in_budget=1, orphaned_count=1, retryable=True, rand=0.5, lost=True
    )
    assert lost.retry
    # After two losses the first real failure is still the first failure of the budget.
    after = decide_retry(POLICY, attempt_in_budget=3, orphaned_count=2, retryable=True, rand=0.0)
    assert after.retry and after.delay_s == POLICY.delay_range(1)[0]
    spent = decide_retry(no_retries, attempt_in_budget=3, orphaned_count=2, retryable=True, rand=0.5)
    assert spent.dead_letter_reason is DeadLetterReason.RETRIES_EXHAUSTED


def test_a_failure_plan_waits_for_its_retry_or_dead_letters_with_a_reason() -> None:
    from datetime import UTC, datetime, timedelta

    from treadle.domain.retry import plan_failure
    from treadle.domain.states import AttemptOutcome, TaskState

    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    policy = RetryPolicy(retries=1, retry_delay_s=10, jitter=0)
    retry = plan_failure(
        policy,
        outcome=AttemptOutcome.FAILED,
        attempt_in_budget=1,
        orphaned_count=0,
        retryable=True,
        rand=0.5,
        now=now,
    )
    assert (retry.state, retry.next_attempt_at, retry.dead_letter_reason, retry.orphaned) == (
        TaskState.RETRY_WAIT,
        now + timedelta(seconds=10),
        None,
        False,
    )
    spent = plan_failure(
        policy,
        outcome=AttemptOutcome.TIMED_OUT,
        attempt_in_budget=2,
        orphaned_count=0,
        retryable=True,
        rand=0,
        now=now,
    )
    assert (spent.state, spent.next_attempt_at, spent.dead_letter_reason) == (
        TaskState.DEAD_LETTER,
        None,
        "retries_exhausted",
    )
    # A loss spends nothing, but the third one is poison whatever the budget.
    lost = plan_failure(
        policy,
        outcome=AttemptOutcome.LOST,
        attempt_in_budget=5,
        orphaned_count=1,
        retryable=True,
        rand=0,
        now=now,
    )
    assert (lost.state, lost.orphaned) == (TaskState.RETRY_WAIT, True)
    poison = plan_failure(
        policy,
        outcome=AttemptOutcome.LOST,
        attempt_in_budget=5,
        orphaned_count=2,
        retryable=True,
        rand=0,
        now=now,
    )
    assert (poison.state, poison.dead_letter_reason) == (TaskState.DEAD_LETTER, "poison")
