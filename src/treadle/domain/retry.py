"""Retry policy: how long to wait before the next attempt, and when to give up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from treadle.domain.states import AttemptOutcome, DeadLetterReason, TaskState

#: Lease expiries after which a task instance is dead-lettered as poison, whatever its budget.
POISON_ORPHAN_LIMIT = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Retry settings of one task."""

    retries: int = 0
    retry_delay_s: float = 30.0
    backoff_factor: float = 2.0
    max_retry_delay_s: float = 3600.0
    #: Fraction of the delay drawn at random and added or removed (0 <= jitter <= 1).
    jitter: float = 0.1

    def delay_range(self, failed_attempt: int) -> tuple[float, float]:
        """Return the (lowest, highest) delay after the given failed attempt of a budget (1-based)."""
        base = self.retry_delay_s * self.backoff_factor ** max(failed_attempt - 1, 0)
        base = min(base, self.max_retry_delay_s)
        low = max(base * (1.0 - self.jitter), 0.0)
        high = min(base * (1.0 + self.jitter), self.max_retry_delay_s)
        return low, max(high, low)

    def delay_s(self, failed_attempt: int, *, rand: float) -> float:
        """Return the delay after a failed attempt; `rand` is a uniform draw in [0, 1)."""
        low, high = self.delay_range(failed_attempt)
        return low + (high - low) * rand


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryDecision:
    """What happens after an attempt that did not succeed."""

    retry: bool
    delay_s: float = 0.0
    dead_letter_reason: DeadLetterReason | None = None


def decide_retry(
    policy: RetryPolicy,
    *,
    attempt_in_budget: int,
    orphaned_count: int,
    retryable: bool,
    rand: float,
    lost: bool = False,
) -> RetryDecision:
    """Decide whether an attempt that did not succeed is retried, and after how long.

    Lost attempts (the worker died; the lease expired) are counted apart from errors (F16):
    they never spend the retry budget, but the third one dead-letters the task as poison.

    Args:
        policy: the task's retry settings.
        attempt_in_budget: 1-based number of this attempt since the budget was last reset.
        orphaned_count: lost attempts since then, including this one if it was lost.
        retryable: False for errors that must never be retried.
        rand: uniform draw in [0, 1) for the jitter.
        lost: this attempt was lost rather than failed.
    """
    if orphaned_count >= POISON_ORPHAN_LIMIT:
        return RetryDecision(retry=False, dead_letter_reason=DeadLetterReason.POISON)
    if lost:
        return RetryDecision(retry=True, delay_s=policy.delay_s(orphaned_count, rand=rand))
    if not retryable:
        return RetryDecision(retry=False, dead_letter_reason=DeadLetterReason.NON_RETRYABLE)
    failures = attempt_in_budget - orphaned_count
    if failures > policy.retries:
        return RetryDecision(retry=False, dead_letter_reason=DeadLetterReason.RETRIES_EXHAUSTED)
    return RetryDecision(retry=True, delay_s=policy.delay_s(failures, rand=rand))


@dataclass(frozen=True, slots=True, kw_only=True)
class FailurePlan:
    """Where the task instance of an attempt that did not succeed goes next."""

    decision: RetryDecision
    state: TaskState
    next_attempt_at: datetime | None
    #: The attempt was lost (its worker died): counted as an orphaning, not a failure.
    orphaned: bool

    @property
    def dead_letter_reason(self) -> str | None:
        """Why it is dead-lettered (None when it is retried)."""
        reason = self.decision.dead_letter_reason
        return reason.value if reason else None


def plan_failure(
    policy: RetryPolicy,
    *,
    outcome: AttemptOutcome,
    attempt_in_budget: int,
    orphaned_count: int,
    retryable: bool,
    rand: float,
    now: datetime,
) -> FailurePlan:
    """Decide the next state of a task instance whose attempt ended `outcome` at `now`.

    `orphaned_count` counts earlier lost attempts only; a `lost` outcome adds this one. An
    `unknown_commit` attempt is never retried: it waits for an operator in
    `needs_inspection` (whatever its budget: retrying could write the output twice).
    """
    if outcome is AttemptOutcome.UNKNOWN_COMMIT:
        return FailurePlan(
            decision=RetryDecision(retry=False),
            state=TaskState.NEEDS_INSPECTION,
            next_attempt_at=None,
            orphaned=False,
        )
    lost = outcome is AttemptOutcome.LOST
    decision = decide_retry(
        policy,
        attempt_in_budget=attempt_in_budget,
        orphaned_count=orphaned_count + (1 if lost else 0),
        retryable=retryable,
        rand=rand,
        lost=lost,
    )
    if decision.retry:
        return FailurePlan(
            decision=decision,
            state=TaskState.RETRY_WAIT,
            next_attempt_at=now + timedelta(seconds=decision.delay_s),
            orphaned=lost,
        )
    return FailurePlan(decision=decision, state=TaskState.DEAD_LETTER, next_attempt_at=None, orphaned=lost)
