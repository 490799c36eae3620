"""Sensors through a real scheduler and worker: many pokes on one slot while other work runs,
timeouts that dead-letter or skip, and submit-then-poll jobs that survive a worker's death and
are cancelled for real."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e]

SENSOR_DAGS = """
    from __future__ import annotations

    from pathlib import Path

    from treadle import Ready, dag, sensor, task

    FLAG = Path(__FLAG__)


    @sensor(poke_interval=0.05, timeout=300)
    def flag_landed(context):
        if not FLAG.exists():
            return False
        return Ready(value={"bytes": FLAG.stat().st_size}, evidence={"size": FLAG.stat().st_size})


    @task
    def after(found: dict) -> int:
        return found["bytes"]


    @task
    def step(n: int = 0) -> int:
        return n + 1


    @dag(dag_id="waits")
    def waits() -> None:
        after(flag_landed())


    @dag(dag_id="busy")
    def busy() -> None:
        step(step(step(step(step()))))


    @sensor(poke_interval=0.1, timeout=1.5)
    def never() -> bool:
        return False


    @sensor(poke_interval=0.1, timeout=1.5, soft_fail=True)
    def never_soft() -> bool:
        return False


    @dag(dag_id="times_out")
    def times_out() -> None:
        step(never())


    @dag(dag_id="soft")
    def soft() -> None:
        step(never_soft())
"""


def test_a_sensor_pokes_without_holding_the_slot(db_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(db_url)
    flag = c.root / "flag"
    c.write_dag("sensors.py", SENSOR_DAGS, flag=str(flag))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "1")
    waiting = c.trigger("waits")

    def pokes() -> int:
        return sum(1 for a in c.detail(waiting).attempts if a.outcome == "rescheduled")

    wait_for(lambda: pokes() >= 3, timeout=120, message="the sensor to poke a few times")
    # The one slot is free between pokes: a whole chain runs while the sensor waits.
    busy = c.trigger("busy")
    done = c.wait_run(busy, timeout=120)
    assert done.run.state == "success" and done.results["step__4"] == 5
    assert c.detail(waiting).run.state == "running"
    wait_for(lambda: pokes() >= 20, timeout=180, message="twenty pokes")
    why = c.cli("why", waiting, "flag_landed")
    assert why.returncode == 0 and "next poke" in why.stdout and "pokes so far" in why.stdout, why.stdout
    flag.write_text("12345")
    final = c.wait_run(waiting, timeout=120)
    assert final.run.state == "success"
    assert final.results["after"] == 5
    attempts = [a for a in final.attempts if a.task_id == "flag_landed"]
    assert [a.outcome for a in attempts[:-1]] == ["rescheduled"] * (len(attempts) - 1)
    assert attempts[-1].outcome == "success" and attempts[-1].outputs == {"evidence": {"size": 5}}
    [instance] = [t for t in final.task_instances if t.task_id == "flag_landed"]
    assert instance.attempt - instance.budget_base == 1  # pokes spent no retry

    timed_out, soft = c.trigger("times_out"), c.trigger("soft")
    hard_end = c.wait_run(timed_out, timeout=120)
    states = {t.task_id: (t.state, t.dead_letter_reason) for t in hard_end.task_instances}
    assert states == {"never": ("dead_letter", "sensor_timeout"), "step": ("upstream_failed", None)}
    assert hard_end.run.state == "failed"
    last = [a for a in hard_end.attempts if a.task_id == "never"][-1]
    assert (last.outcome, last.error_type) == ("timed_out", "SensorTimeout")
    soft_end = c.wait_run(soft, timeout=120)
    assert {t.task_id: t.state for t in soft_end.task_instances} == {
        "never_soft": "skipped",
        "step": "skipped",
    }
    assert soft_end.run.state == "success"
