"""A full disk re-runs no finished work, and claiming resumes by itself when space returns.

`treadle standalone` runs on a SQLite file in a small tmpfs (mounted by the test, which needs
root; skipped otherwise). A filler file takes nearly all the space, so the results of finished
attempts cannot be written: the slots hold them (and claim nothing more) until the filler is
removed, then record them. Every task writes one line when it finishes.
"""

from __future__ import annotations

import collections
import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TASKS = 24

BIG_RESULTS_DAG = """
    from __future__ import annotations

    import os

    from treadle import TaskContext, dag, task

    EFFECTS = __EFFECTS__


    def work(context: TaskContext) -> str:
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"end {context.task_id} {context.attempt}\\n".encode())
        os.close(fd)
        return "x" * 400_000  # large enough that a nearly full disk refuses it


    @dag(dag_id="big_results")
    def big_results() -> None:
        for n in range(__TASKS__):
            task(task_id=f"t{n}", retries=3, retry_delay=0)(work)()
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, *, leave_bytes: int) -> Path:
    filler = disk / "filler"
    free = shutil.disk_usage(disk).free
    with filler.open("wb", buffering=0) as f:  # unbuffered: nothing left to write at close
        f.truncate(0)
        try:
            f.write(b"\0" * max(free - leave_bytes, 0))
        except OSError as exc:  # the database grew meanwhile and took the rest: full is the aim
            if exc.errno != errno.ENOSPC:
                raise
    return filler


def test_a_full_disk_reruns_no_finished_work_and_claiming_resumes(
    small_disk: Path, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(f"sqlite:///{small_disk / 'treadle.db'}", TREADLE_MAX_RESULT_BYTES="1048576")
    effects = c.root / "effects.log"  # outside the small disk
    c.write_dag("big.py", BIG_RESULTS_DAG, effects=str(effects), tasks=TASKS)
    assert c.cli("db", "upgrade").returncode == 0
    standalone = c.start("standalone", "standalone", "--concurrency", "2")
    c.wait_dag("big_results", timeout=60)
    # Filled before the trigger: a woken standalone would finish the run while the filler is
    # still being written. What is left holds the run and a few results, not all of them.
    filler = _fill(small_disk, leave_bytes=2_000_000)
    run_id = c.trigger("big_results")

    wait_for(lambda: "worker.outcome_held" in c.log("standalone"), timeout=90, message="the disk to fill up")
    held_at = sum(1 for line in effects.read_text().splitlines())
    filler.unlink()

    detail = c.wait_run(run_id, timeout=120)
    assert detail.run.state == "success", {t.task_id: t.state for t in detail.task_instances}
    ends = collections.Counter(line.split()[1] for line in effects.read_text().splitlines())
    assert set(ends) == {f"t{n}" for n in range(TASKS)}
    assert {t: n for t, n in ends.items() if n > 1} == {}, "finished work ran again after the disk filled"
    assert held_at < TASKS  # the slots held their outcomes instead of claiming the rest
    assert "worker.outcome_recorded" in c.log("standalone")
    assert standalone.poll() is None
