"""Results must be strict JSON within the size limit; otherwise the task dead-letters at once."""

from __future__ import annotations

import pytest

from treadle import dag, task
from treadle.testing import run_dag


@task(retries=3, retry_delay=0)
def returns_a_set() -> object:
    return {1, 2}


@task(retries=3, retry_delay=0)
def returns_nan() -> float:
    return float("nan")


@task(retries=3, retry_delay=0)
def returns_too_much() -> str:
    return "x" * 2000


@pytest.mark.parametrize(
    ("fn", "error_type"),
    [
        (returns_a_set, "ResultNotSerializable"),
        (returns_nan, "ResultNotSerializable"),
        (returns_too_much, "ResultTooLarge"),
    ],
)
def test_bad_results_are_not_retried(db_url: str, fn: object, error_type: str) -> None:
    @dag(dag_id="bad_result")
    def bad_result() -> None:
        fn()  # type: ignore[operator]

    result = run_dag(bad_result, database_url=db_url, max_result_bytes=1024)

    [attempt] = result.attempt_history
    assert (attempt.outcome, attempt.error_type) == ("failed", error_type)
    assert result.task_states == {fn.__name__: "dead_letter"}  # type: ignore[attr-defined]
    assert result.results == {}
