"""Command tasks through a real worker: exit classes, attempt logs and `treadle logs`, outputs,
the run manifest and its retention, the allow-list, and a timeout that kills the program's group."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import Cluster, process_alive
from tests.helpers.processes import run_cli
from tests.helpers.wait import wait_for
from treadle.store.tables import task_attempts

pytestmark = [pytest.mark.e2e]

#: A stand-in for an external job: behaves as its first argument says.
JOB = """
    import json, os, sys, time
    from pathlib import Path

    mode = sys.argv[1]
    manifest_file = sys.argv[sys.argv.index("--run-manifest") + 1]
    manifest = json.loads(Path(manifest_file).read_text())
    out = Path(os.environ["TREADLE_OUTPUT_DIR"])
    print(f"job {mode} starting for run {manifest['run_id']}", flush=True)
    print(f"job {mode} complains on stderr", file=sys.stderr, flush=True)
    if mode == "ok":
        env = {k: v for k, v in os.environ.items() if k.startswith("TREADLE_") and k != "TREADLE_OUTPUT_DIR"}
        (out / "run-output.json").write_text(json.dumps({"rows": 3, "env": env, "manifest": manifest_file}))
        (out / "metrics.json").write_text(json.dumps({"rows_written": 3}))
        (out / "lineage.json").write_text(json.dumps({"inputs": ["a"], "outputs": ["b"]}))
        sys.exit(0)
    if mode == "exit":
        (out / "error-report.json").write_text(json.dumps({"code": int(sys.argv[2])}))
        sys.exit(int(sys.argv[2]))
    if mode == "spawn":  # a grandchild, then hang: the timeout must end both
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(sys.argv[2], f"job-{os.getpid()}").write_text(f"{os.getpid()} {child.pid}")
        time.sleep(600)
"""

DAG = """
    from __future__ import annotations

    import sys

    from treadle import CommandTask, dag

    PY = sys.executable
    JOB = __JOB__


    @dag(dag_id="commands")
    def commands() -> None:
        CommandTask(task_id="ok", argv=[PY, JOB, "ok"], exit_codes="standard")
        CommandTask(task_id="not_ready", argv=[PY, JOB, "exit", "20"], exit_codes="standard", retries=1,
                    retry_delay=0)
        CommandTask(task_id="violation", argv=[PY, JOB, "exit", "30"], exit_codes="standard", retries=3)
        CommandTask(task_id="unknown", argv=[PY, JOB, "exit", "60"], exit_codes="standard", retries=3)
        CommandTask(task_id="plain_failure", argv=[PY, JOB, "exit", "3"], retries=0)
        CommandTask(task_id="refused", argv=["/bin/true"], retries=3)
        CommandTask(task_id="narrowed", argv=[PY, JOB, "ok"], allowed=["java"], retries=3)
"""


def _states(c: Cluster, run_id: str) -> dict[str, str]:
    return {t.task_id: t.state for t in c.detail(run_id).task_instances}


def test_command_exit_classes_logs_outputs_and_allowlist(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url, TREADLE_COMMAND_ALLOWLIST=f"{Path(sys.executable).name},/usr/bin/env")
    job = c.root / "job.py"
    job.write_text(textwrap.dedent(JOB))
    c.write_dag("commands.py", DAG, job=str(job))
    assert c.cli("dags", "sync").returncode == 0
    # `tasks test` runs the program in place, recording nothing.
    tried = c.cli("tasks", "test", "commands", "ok")
    assert tried.returncode == 0 and json.loads(tried.stdout)["rows"] == 3, tried.stderr
    assert "job ok starting for run test" in tried.stderr
    broken = c.cli("tasks", "test", "commands", "violation")
    assert broken.returncode != 0 and "exited with code 30" in broken.stderr
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "3")
    run_id = c.trigger("commands")
    expected = {
        "ok": "success",
        "not_ready": "dead_letter",
        "violation": "dead_letter",
        "unknown": "needs_inspection",
        "plain_failure": "dead_letter",
        "refused": "dead_letter",
        "narrowed": "dead_letter",
    }
    wait_for(lambda: _states(c, run_id) == expected, timeout=120, message=f"states {expected}")
    detail = c.detail(run_id)
    attempts: dict[str, list[tuple[str, int | None]]] = {}
    for a in detail.attempts:
        attempts.setdefault(a.task_id, []).append((a.outcome, a.exit_code))
    assert attempts == {
        "ok": [("success", 0)],
        "not_ready": [("failed", 20), ("failed", 20)],  # retryable: its one retry was spent
        "violation": [("failed", 30)],  # non-retryable: never retried
        "unknown": [("unknown_commit", 60)],
        "plain_failure": [("failed", 3)],
        "refused": [("failed", None)],
        "narrowed": [("failed", None)],
    }
    by_task = {a.task_id: a for a in detail.attempts}
    reasons = {t.task_id: t.dead_letter_reason for t in detail.task_instances}
    assert reasons["not_ready"] == "retries_exhausted"
    assert reasons["violation"] == reasons["refused"] == reasons["narrowed"] == "non_retryable"

    # The stderr tail is in the error; the reports the job left are stored with the attempt.
    violation = by_task["violation"]
    assert violation.error_type == "CommandFailed"
    assert "exited with code 30" in (violation.error_message or "")
    assert "job exit complains on stderr" in (violation.error_message or "")
    assert violation.outputs == {"error-report": {"code": 30}}
    refused = by_task["refused"]
    assert refused.error_type == "CommandNotAllowed"
    assert "TREADLE_COMMAND_ALLOWLIST" in (refused.error_message or "")
    assert "/bin/true" in (refused.error_message or "")
    assert "allowed=" in (by_task["narrowed"].error_message or "")

    # run-output.json is the result; metrics and lineage are kept with the attempt.
    result = detail.results["ok"]
    assert result["rows"] == 3
    env = result["env"]
    assert env["TREADLE_RUN_ID"] == run_id
    assert (env["TREADLE_DAG_ID"], env["TREADLE_TASK_ID"], env["TREADLE_ATTEMPT"]) == ("commands", "ok", "1")
    assert env["TREADLE_MAP_INDEX"] == "-1"
    assert len(env["TREADLE_TRACE_ID"]) == 32
    assert by_task["ok"].outputs == {
        "metrics": {"rows_written": 3},
        "lineage": {"inputs": ["a"], "outputs": ["b"]},
    }
    # Both attempts of one run carry the same trace id: compare through the second attempt's env.
    manifest = Path(result["manifest"])
    assert manifest == c.home / "runs" / run_id / "manifest.json"
    assert env["TREADLE_MANIFEST_FILE"] == str(manifest)
    assert json.loads(manifest.read_text())["run_id"] == run_id  # it outlived the attempt

    # stdout and stderr are in the attempt's log, which `treadle logs` prints; not in the worker's.
    log_file = c.home / "logs" / "commands" / run_id / "ok" / "1.log"
    text = log_file.read_text()
    assert "job ok starting" in text and "job ok complains on stderr" in text
    assert "job ok starting" not in c.log("w1")
    shown = c.cli("logs", run_id, "ok")
    assert shown.returncode == 0, shown.stderr
    assert "job ok starting" in shown.stdout and "complains on stderr" in shown.stdout
    first = c.cli("logs", run_id, "not_ready", "--attempt", "1")
    assert "job exit starting" in first.stdout
    assert c.cli("logs", run_id, "not_ready", "--attempt", "3").returncode != 0

    # A missing log: the message says where it was looked for and which host ran the attempt.
    log_file.unlink()
    missing = c.cli("logs", run_id, "ok")
    assert missing.returncode != 0
    assert f"ran on this host ({socket.gethostname()})" in missing.stderr
    assert str(log_file) in missing.stderr and "TREADLE_LOGS_FOLDER" in missing.stderr
    with c.db.engine.begin() as conn:  # as if a worker on another host had run it
        conn.execute(
            sa.update(task_attempts)
            .where(task_attempts.c.run_id == run_id, task_attempts.c.task_id == "ok")
            .values(hostname="batch-host-7")
        )
    elsewhere = c.cli("logs", run_id, "ok")
    assert elsewhere.returncode != 0 and "it ran on batch-host-7" in elsewhere.stderr
    assert "run `treadle logs` there" in elsewhere.stderr


def test_manifest_and_logs_are_removed_with_run_retention(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url)
    job = c.root / "job.py"
    job.write_text(textwrap.dedent(JOB))
    c.write_dag(
        "one.py",
        """
        from __future__ import annotations

        import sys

        from treadle import CommandTask, dag


        @dag(dag_id="one")
        def one() -> None:
            CommandTask(task_id="ok", argv=[sys.executable, __JOB__, "ok"])
        """,
        job=str(job),
    )
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker")
    run_id = c.trigger("one")
    assert c.wait_run(run_id, timeout=120).run.state == "success"
    run_files = c.home / "runs" / run_id
    logs = c.home / "logs" / "one" / run_id
    assert (run_files / "manifest.json").is_file() and (logs / "ok" / "1.log").is_file()

    def pruned() -> bool:
        done = c.cli_json("db", "prune", "--older-than", "1s")
        return bool(done["rows"]["dag_runs"])

    wait_for(pruned, timeout=60, interval=0.5, message="the finished run to be pruned")
    assert not run_files.exists() and not logs.exists()


def test_timeout_kills_the_commands_whole_process_group(db_url: str, cluster: Callable[..., Cluster]) -> None:
    c = cluster(db_url)
    job = c.root / "job.py"
    job.write_text(textwrap.dedent(JOB))
    c.write_dag(
        "slow.py",
        """
        from __future__ import annotations

        import sys

        from treadle import CommandTask, dag


        @dag(dag_id="slow")
        def slow() -> None:
            CommandTask(task_id="hang", argv=[sys.executable, __JOB__, "spawn", __PIDS__], timeout=3)
        """,
        job=str(job),
        pids=str(c.pids),
    )
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker")
    run_id = c.trigger("slow")
    pids = wait_for(lambda: c.recorded_pids(), timeout=60, message="the job and its child to start")
    assert len(pids) == 2
    final = c.wait_run(run_id, timeout=120)
    assert final.run.state == "failed"
    [attempt] = final.attempts
    assert attempt.outcome == "timed_out"
    wait_for(
        lambda: not any(process_alive(p) for p in pids), timeout=30, message="the job's processes to end"
    )


PY_DAG = """
    from __future__ import annotations

    import os
    import sys
    import time
    from pathlib import Path

    from treadle import dag, task

    GO = Path(__GO__)


    @task
    def chatty() -> int:
        print("first line from the task", flush=True)
        os.system("echo a line from a subprocess")
        while not GO.exists():
            time.sleep(0.05)
        print("last line from the task")
        print("and one on stderr", file=sys.stderr)
        return 1


    @dag(dag_id="chatty")
    def chatty_dag() -> None:
        chatty()
"""


def test_python_task_output_goes_to_its_attempt_log_and_logs_follow_tails_it(
    db_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(db_url)
    go = c.root / "go"
    c.write_dag("chatty.py", PY_DAG, go=str(go))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker")
    run_id = c.trigger("chatty")
    log_file = c.home / "logs" / "chatty" / run_id / "chatty" / "1.log"
    wait_for(
        lambda: log_file.exists() and "first line" in log_file.read_text(),
        timeout=60,
        message="the first line",
    )
    follow = subprocess.Popen(
        [sys.executable, "-m", "treadle.cli", "logs", run_id, "chatty", "--follow"],
        env=c.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # it follows the running attempt before it ends
        assert "first line from the task" in first
        go.write_text("go")
        # Not communicate(): it would skip what readline() already buffered.
        out = first + follow.stdout.read()
        assert follow.stderr is not None
        err = follow.stderr.read()
        follow.wait(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    assert "first line from the task" in out and "a line from a subprocess" in out
    assert "last line from the task" in out and "and one on stderr" in out
    assert c.wait_run(run_id, timeout=60).run.state == "success"
    assert "first line from the task" not in c.log("w1")
    printed = run_cli(["logs", run_id, "chatty"], c.env)
    assert printed.stdout == log_file.read_text()
