"""A starting worker: `starting` in the workers table until its task processes are up, then
`running`; it claims without waiting for its DAG folder to be imported, and its task processes
import the file of the DAG they run, not the whole folder."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from treadle.engine.workers import list_workers

pytestmark = pytest.mark.e2e

FILLER = """
    import decimal

    from treadle import dag, task


    @task
    def one() -> str:
        return str(decimal.Decimal(__N__))


    @dag(dag_id="filler___N__")
    def filler() -> None:
        one()
"""

QUICK = """
    import json
    import os
    import sys

    from treadle import dag, task


    @task
    def report() -> None:
        modules = sorted(m for m in sys.modules if m.startswith("treadle_dags_"))
        with open(__OUT__, "w") as out:
            json.dump({"pid": os.getpid(), "dag_modules": modules}, out)


    @dag(dag_id="quick")
    def quick() -> None:
        report()
"""

#: Sorted first in the folder: the worker's sync and the fork server's import of the folder wait
#: in it until the test releases it.
SLOW = """
    import os
    import time

    from treadle import dag, task

    while not os.path.exists(__RELEASE__):
        time.sleep(0.05)


    @task
    def nothing() -> None:
        pass


    @dag(dag_id="slow")
    def slow() -> None:
        nothing()
"""

#: Holds the fork server a moment before it is ready, so that `starting` lasts long enough to be
#: seen (the worker process itself is not delayed).
SLOW_FORK_SERVER = """
import sys
import time

if any("treadle.worker.forkserver" in arg for arg in getattr(sys, "orig_argv", ())):
    time.sleep(3)
"""


@pytest.fixture
def release(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "release"
    yield path
    path.touch()  # lets the processes still importing the slow file finish and end


def test_a_worker_is_starting_then_running_and_claims_before_its_folder_is_imported(
    sqlite_url: str, cluster: Callable[..., Cluster], release: Path
) -> None:
    c = cluster(sqlite_url)
    for n in range(40):
        c.write_dag(f"filler_{n:02d}.py", FILLER, n=n)
    out = c.root / "report.json"
    c.write_dag("z_quick.py", QUICK, out=str(out))
    assert c.cli("dags", "sync").returncode == 0
    run_id = c.trigger("quick")
    c.write_dag("a_slow.py", SLOW, release=str(release))
    site = c.root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_FORK_SERVER)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    c.start("worker", "worker", "--concurrency", "4", env={"PYTHONPATH": path})

    def state() -> str | None:
        return next((w.state for w in list_workers(c.db)), None)

    wait_for(lambda: state() == "starting", timeout=60, interval=0.02, message="the worker to say starting")
    wait_for(lambda: state() == "running", timeout=60, interval=0.05, message="the worker to say running")
    detail = c.wait_run(run_id, timeout=60)

    assert detail.run.state == "success"
    # Claimed and ran while its own sync of the folder still waits in the slow file.
    assert '"dags.synced"' not in c.log("worker")
    assert not release.exists()
    report = json.loads(out.read_text())
    # The task process imported the file of its DAG alone, not the folder's 42 files.
    assert len(report["dag_modules"]) == 1 and "quick" in report["dag_modules"][0]
