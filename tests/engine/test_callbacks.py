"""on_retry / on_dead_letter run after the outcome is recorded; a failing callback changes nothing."""

from __future__ import annotations

from typing import Any

from treadle import TaskContext, dag, task
from treadle.testing import run_dag

calls: list[tuple[str, str, int, str]] = []


def record_retry(context: TaskContext, error: dict[str, Any]) -> None:
    calls.append(("on_retry", context.task_id, context.attempt, error["error_type"]))


def broken_alert(context: TaskContext, error: dict[str, Any]) -> None:
    calls.append(("on_dead_letter", context.task_id, context.attempt, error["error_type"]))
    raise RuntimeError("the alerting service is down")


@task(retries=2, retry_delay=0, on_retry=record_retry, on_dead_letter=broken_alert)
def always_fails() -> None:
    raise KeyError("customer_id")


@task
def downstream(value: Any) -> Any:
    return value


@task
def sibling() -> str:
    return "fine"


@dag(dag_id="callbacks")
def callbacks() -> None:
    downstream(always_fails())
    sibling()


def test_callbacks_see_each_outcome_and_cannot_change_it(db_url: str) -> None:
    calls.clear()
    result = run_dag(callbacks, database_url=db_url)

    assert calls == [
        ("on_retry", "always_fails", 1, "KeyError"),
        ("on_retry", "always_fails", 2, "KeyError"),
        ("on_dead_letter", "always_fails", 3, "KeyError"),
    ]
    assert result.state == "failed"
    assert result.task_states == {
        "always_fails": "dead_letter",
        "downstream": "upstream_failed",
        "sibling": "success",
    }
    assert [a.outcome for a in result.attempts("always_fails")] == ["failed"] * 3
