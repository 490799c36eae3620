"""LocalProcessJob's own contract with real processes: the command outlives the process that
submitted it, its exit code is read from the wrapper's file, and cancel ends it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import process_alive
from tests.helpers.wait import wait_for
from treadle.authoring.context import Poke, TaskContext
from treadle.jobs import LocalProcessJob

pytestmark = [pytest.mark.e2e]


def _context(tmp_path: Path) -> TaskContext:
    return TaskContext(
        run_id="r", dag_id="d", task_id="t", logical_date=datetime.now(UTC), attempt=1, poke=Poke()
    )


def test_exit_codes_are_read_from_the_wrapper(tmp_path: Path) -> None:
    ok = LocalProcessJob([sys.executable, "-c", "print('hi')"], base_dir=str(tmp_path))
    handle = ok.submit(_context(tmp_path))
    wait_for(
        lambda: ok.poll(handle, _context(tmp_path)).status != "running", timeout=60, message="the job to end"
    )
    result = ok.poll(handle, _context(tmp_path))
    assert (result.status, result.result["exit_code"]) == ("success", 0)
    assert (Path(handle["dir"]) / "stdout").read_text() == "hi\n"

    bad = LocalProcessJob(
        [sys.executable, "-c", "import sys; sys.stderr.write('no input'); sys.exit(20)"],
        base_dir=str(tmp_path),
    )
    handle = bad.submit(_context(tmp_path))
    wait_for(
        lambda: bad.poll(handle, _context(tmp_path)).status != "running", timeout=60, message="the job to end"
    )
    failed = bad.poll(handle, _context(tmp_path))
    assert (failed.status, failed.exit_code) == ("failed", 20) and "no input" in failed.message

    missing = LocalProcessJob(["/nonexistent/program"], base_dir=str(tmp_path))
    handle = missing.submit(_context(tmp_path))
    wait_for(
        lambda: missing.poll(handle, _context(tmp_path)).status != "running",
        timeout=60,
        message="the job to end",
    )
    assert missing.poll(handle, _context(tmp_path)).exit_code == 127


def test_the_job_outlives_its_submitter_and_cancel_ends_it(tmp_path: Path) -> None:
    # Submit from a separate process that exits at once, as a task process may die.
    script = (
        "import json, sys\n"
        "from datetime import datetime, UTC\n"
        "from treadle.authoring.context import TaskContext\n"
        "from treadle.jobs import LocalProcessJob\n"
        "argv = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
        "job = LocalProcessJob(argv, base_dir=sys.argv[1])\n"
        "ctx = TaskContext(run_id='r', dag_id='d', task_id='t', logical_date=datetime.now(UTC), attempt=1)\n"
        "print(json.dumps(job.submit(ctx)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True
    )

    handle = json.loads(out.stdout)
    job = LocalProcessJob([sys.executable, "-c", "pass"], base_dir=str(tmp_path), cancel_grace=5)
    wait_for(lambda: (Path(handle["dir"]) / "pid").exists(), timeout=60, message="the command to start")
    pid = int((Path(handle["dir"]) / "pid").read_text())
    try:
        assert process_alive(pid) and job.poll(handle, _context(tmp_path)).status == "running"
        job.cancel(handle)
        wait_for(lambda: not process_alive(pid), timeout=30, message="the command to end")
        ended = job.poll(handle, _context(tmp_path))
        assert ended.status == "failed" and ended.exit_code == 128 + 15
        job.cancel(handle)  # a second cancel of an ended job does nothing
    finally:
        if process_alive(pid):
            os.kill(pid, 9)
