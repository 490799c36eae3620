"""Sensors through a real scheduler and worker: many pokes on one slot while other work runs,
timeouts that dead-letter or skip, and submit-then-poll jobs that survive a worker's death and
are cancelled for real."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from tests.e2e.conftest import SHORT_LEASE, Cluster, process_alive
from tests.helpers.wait import wait_for
from treadle.store import job_cancellations as job_cancels

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

    def explained() -> str | None:  # asked between two pokes (a poke in flight reads "running")
        [why] = c.cli_json("why", waiting, "flag_landed")
        return str(why["reason"]) if why["state"] == "up_for_reschedule" else None

    reason = wait_for(explained, timeout=120, message="the sensor to be seen waiting between pokes")
    assert "next poke at" in reason and "pokes so far" in reason and "timeout 300 s" in reason, reason
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


JOB_DAGS = """
    from __future__ import annotations

    import sys

    from treadle import dag, task
    from treadle.jobs import LocalProcessJob

    # The job records its pid (and its wrapper's) for the test, appends to a log of starts, then
    # waits for the release file (or for ever).
    SCRIPT = '''
    import os, pathlib, sys, time
    pids, starts, release = sys.argv[1:4]
    pathlib.Path(pids, f"job-{os.getpid()}").write_text(f"{os.getpid()} {os.getppid()}")
    with open(starts, "a") as out:
        out.write(f"{os.getpid()}\\\\n")
    while not pathlib.Path(release).exists():
        time.sleep(0.05)
    '''


    @task
    def report(result: dict) -> int:
        return result["exit_code"]


    @dag(dag_id="job")
    def job() -> None:
        crunch = LocalProcessJob(
            [sys.executable, "-c", SCRIPT, __PIDS__, __STARTS__, __RELEASE__],
            task_id="crunch",
            poll_interval=0.5,
            timeout=600,
        )
        report(crunch)
"""


def _job_pids(c: Cluster) -> list[int]:
    """The jobs' pids, from the files each job writes (one still empty is being written)."""
    found = (p.read_text().split() for p in sorted(c.pids.glob("job-*")))
    return [int(fields[0]) for fields in found if fields]


def test_a_submitted_job_outlives_its_worker_and_is_polled_not_resubmitted(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url, **SHORT_LEASE)
    starts, release = c.root / "starts", c.root / "release"
    c.write_dag("job.py", JOB_DAGS, pids=str(c.pids), starts=str(starts), release=str(release))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "1")
    run_id = c.trigger("job")

    def submitted() -> bool:
        [t] = [t for t in c.detail(run_id).task_instances if t.task_id == "crunch"]
        return t.state == "up_for_reschedule" and bool(_job_pids(c))

    wait_for(submitted, timeout=120, message="the job to be submitted and its handle recorded")
    c.signal("w1", signal.SIGKILL)
    [job_pid] = _job_pids(c)
    assert process_alive(job_pid)  # detached: the worker's death does not end it
    c.start("w2", "worker", "--concurrency", "1")

    def polled_by_w2() -> bool:
        attempts = [a for a in c.detail(run_id).attempts if a.task_id == "crunch"]
        return len({a.worker_id for a in attempts if a.outcome == "rescheduled"}) >= 2

    wait_for(polled_by_w2, timeout=180, message="the new worker to poll the stored handle")
    release.write_text("go")
    final = c.wait_run(run_id, timeout=180)
    assert final.run.state == "success", c.logs_tail()
    assert final.results["report"] == 0
    assert starts.read_text().split() == [str(job_pid)]  # submitted once
    attempts = [a for a in final.attempts if a.task_id == "crunch"]
    assert attempts[0].outputs is not None and "submitted" in attempts[0].outputs["evidence"]
    assert {a.outcome for a in attempts[:-1]} <= {"rescheduled", "lost"}
    assert attempts[-1].outcome == "success"


def test_cancelling_a_submitted_job_reaches_its_process(db_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(db_url)
    starts, release = c.root / "starts", c.root / "never"
    c.write_dag("job.py", JOB_DAGS, pids=str(c.pids), starts=str(starts), release=str(release))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "1")
    run_id = c.trigger("job")
    wait_for(lambda: bool(_job_pids(c)), timeout=120, message="the job to start")
    [job_pid] = _job_pids(c)
    wait_for(
        lambda: any(a.outcome == "rescheduled" for a in c.detail(run_id).attempts),
        timeout=120,
        message="the handle to be recorded",
    )
    cancelled = c.cli("runs", "cancel", run_id, "--reason", "wrong input")
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for(lambda: not process_alive(job_pid), timeout=120, message="the cancel to reach the job's process")
    detail = c.detail(run_id)
    assert detail.run.state == "cancelled"
    with c.db.read() as conn:
        rows = job_cancels.list_for_run(conn, run_id)
    wait_for(lambda: _cancel_done(c, run_id), timeout=60, message="the owed cancel to be recorded done")
    assert len(rows) == 1 and rows[0]["task_id"] == "crunch"
    assert not release.exists()


def _cancel_done(c: Cluster, run_id: str) -> bool:
    with c.db.read() as conn:
        rows = job_cancels.list_for_run(conn, run_id)
    return len(rows) == 1 and rows[0]["done_at"] is not None and rows[0]["error"] is None
